"""What one warm rollout's program can do to another rollout or to the warm interpreter
(mesh/_warm.py, mesh/_warm_ahead.py), tried for real: the descriptors and shared pages it inherits,
its init and the other rollouts' processes, its report lines, the spare TLS context it is handed.
Whatever a program can read or influence, the policy can learn to exploit: each probe is an attack
a program makes, and each test says what must hold."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollmesh.scheduler.drivers.program import CaptureOpened
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.tool_endpoint import ToolEndpoint
from rollmesh.scheduler.drivers.warm import WarmStart
from rollmesh.scheduler.errors import AgentProgramExited
from rollmesh.scheduler.errors import AgentProgramTimedOut
from tests.integration.test_agent_hosts import ROOT
from tests.integration.test_agent_hosts import _answered
from tests.integration.test_agent_hosts import _rollout
from tests.integration.test_agent_hosts import agent_script
from tests.integration.test_sandbox_forker import _writable_memory
from tests.unit.test_external_agents import CaptureModel

pytestmark = pytest.mark.skipif(not ROOT, reason="a warm rollout is confined on its own only as root")

PROBE = textwrap.dedent(
    """
    import ctypes, faulthandler, json, os, select, ssl, sys, time

    task = json.load(sys.stdin)
    what = task["task"].get("what", "")


    def descriptors():
        found = {}
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
                with open(f"/proc/self/fdinfo/{name}") as f:
                    flags = next(int(l.split()[1], 8) for l in f if l.startswith("flags:"))
            except (OSError, StopIteration):
                continue  # (the listing's own descriptor, closed)
            found[int(name)] = {"target": target, "access": flags & 3}
        return found


    def context(ctx):
        return {"verify": int(ctx.verify_mode), "hostname": ctx.check_hostname,
                "options": int(ctx.options), "certs": len(ctx.get_ca_certs()),
                "keylog": ctx.keylog_filename}


    scripts = sorted(m for m in sys.modules if m.endswith("__main__") and m != "__main__")
    out = {"what": what, "scripts": scripts, "faulthandler": faulthandler.is_enabled(), "path": sys.path[1:]}
    if what == "hold":  # until the test says go (a file in its folder), then die by its own signal
        open("holding", "w").close()
        while not os.path.exists("go"):
            time.sleep(0.02)
        os.kill(os.getpid(), 9)
    elif what == "steal":  # read another rollout's end of the pipe its status is told on
        theirs = [fd for fd, d in descriptors().items()
                  if fd > 2 and d["target"].startswith("pipe:") and d["access"] == os.O_RDONLY]
        for fd in theirs:
            os.set_blocking(fd, True)
        open("armed", "w").close()
        stolen = []
        if theirs:
            ready, _, _ = select.select(theirs, [], [], 60)
            stolen = [os.read(fd, 64).decode() for fd in ready]
        out["stolen"] = stolen
    elif what == "look":
        out["descriptors"] = descriptors()
        with open("/proc/self/maps") as f:
            out["shared_writable"] = [l.strip() for l in f if l.split()[1][1::2] == "ws"]  # rw-s
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: its own, as a program may
        out["ptrace_init"] = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH to its init
        try:
            out["init_fds"] = os.listdir("/proc/1/fd")
        except OSError as exc:
            out["init_fds"] = type(exc).__name__
        os.kill(1, 9)  # (pid 1 of its namespace: the kernel drops it)
        out["procs"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    elif what == "forge":  # crafted report lines on every pipe it may write but its own output
        lines = ["test.__main__", "model 0", "x" * 30000] + [f"model {n}" for n in range(70000)]
        payload = ("\\n".join(lines) + "\\n").encode()
        for fd, d in descriptors().items():
            if fd > 2 and d["target"].startswith("pipe:") and d["access"] != os.O_RDONLY:
                os.set_blocking(fd, False)
                try:
                    os.write(fd, payload)
                except BlockingIOError:
                    pass
                out.setdefault("written", []).append(fd)
    elif what == "flood":  # its report pipe written without end, each write waiting to be read
        fd = next(fd for fd, d in descriptors().items()
                  if fd > 2 and d["target"].startswith("pipe:") and d["access"] != os.O_RDONLY)
        block = b"model 0\\n" * 8192
        open("holding", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists("go") and time.monotonic() < deadline:
            os.set_blocking(fd, True)  # (each rollout's report sets the pipe non-blocking again)
            try:
                os.write(fd, block)
            except BlockingIOError:
                pass
    elif what == "tls":  # its context, then changed every way a program may change one
        ctx = ssl.create_default_context()
        out["first"] = context(ctx)
        out["second"] = context(ssl.create_default_context())
        out["factory"] = ssl.create_default_context.__name__
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.options |= ssl.OP_NO_TICKET
        ctx.keylog_filename = "mine.log"
    elif what == "tls_own":  # a CA file of its own choosing, then other arguments
        os.environ["SSL_CERT_FILE"] = os.path.abspath("none.pem")
        out["own_file"] = context(ssl.create_default_context())
        out["server_side"] = context(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    elif what in ("leave", "find"):  # System V shared memory: a message for the rollouts after
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = ctypes.c_void_p
        key = int(sys.argv[1])
        shm = libc.shmget(key, 4096, 0o1000 | 0o666 if what == "leave" else 0)  # IPC_CREAT
        out["segment"] = shm >= 0
        if shm >= 0:
            at = libc.shmat(shm, None, 0)
            if what == "leave":
                ctypes.memmove(at, b"the answer is 3", 15)
            else:
                out["found"] = ctypes.string_at(at, 15).decode()
    elif what == "escape":  # out of its process group and session, a child deaf to signals, then hang
        import signal
        os.setsid()
        if os.fork() == 0:  # (its working folder is the rollout's: the test counts it there)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            os.setsid()
            while True:
                time.sleep(1)
        time.sleep(600)
    elif what == "ca":  # SSL_CERT_FILE names a CA file (bound in: an argument)
        out["certs"] = len(ssl.create_default_context().get_ca_certs())
        out["readable"] = os.access(os.environ["SSL_CERT_FILE"], os.R_OK)
    elif what == "keylog":  # SSLKEYLOGFILE set: the keys go where the program's own would
        ctx = ssl.create_default_context()
        out["first"] = context(ctx)
        out["log_in_its_folder"] = os.path.exists(os.environ["SSLKEYLOGFILE"])
    print(json.dumps(out))
    open(os.environ["ROLLMESH_ANSWER_FILE"], "w").write("3")
    """
)


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    return agent_script(tmp_path, "probe.py", PROBE)


def _program(script: Path, **env: str) -> ProgramSpec:
    return ProgramSpec(argv=(sys.executable, str(script)), env=env, timeout_s=90)


def _said(outcome: Any) -> dict[str, Any]:
    return dict(json.loads(outcome.program["stdout"]))


async def _until(condition: Any, what: str, limit_s: float = 60.0) -> None:
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 (the condition is another process's file)
            await asyncio.sleep(0.02)
    assert condition(), what


def _marked(host: WarmStart, name: str) -> list[Path]:
    """The rollouts' folders holding a file `name` (made by the probe in its own folder)."""
    return [] if host.root is None else [p.parent for p in host.root.rglob(name)]


async def _hold(
    host: WarmStart, program: ProgramSpec, tools: ToolEndpoint, model: CaptureModel | None = None
) -> asyncio.Future[Any]:
    """A rollout in flight, its program waiting until `_release`."""
    held = asyncio.ensure_future(_rollout(host, program, 0, tools, what="hold", model=model))
    await _until(lambda: held.done() or bool(_marked(host, "holding")), "the holding rollout runs")
    return held


async def _release(host: WarmStart, held: asyncio.Future[Any]) -> None:
    for folder in _marked(host, "holding"):
        (folder / "go").touch()
    with pytest.raises(AgentProgramExited, match=r"killed by SIGKILL"):
        await held


async def test_a_rollout_cannot_read_how_another_rollouts_program_ended(probe: Path) -> None:
    """The interpreter reads each program's wait status from a pipe its init writes: a rollout
    forked while another runs must not hold that pipe's read end (it would take the status, and a
    program killed by its own signal would be written as an exit code)."""
    program = _program(probe)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        held = await _hold(host, program, tools)
        thief = asyncio.ensure_future(_rollout(host, program, 1, tools, what="steal"))
        await _until(lambda: thief.done() or bool(_marked(host, "armed")), "the thief armed")
        await _release(host, held)
        stolen = _said(await thief)["stolen"]
    finally:
        await host.stop()
        await tools.stop()
    assert stolen == []


async def test_a_rollout_holds_nothing_of_the_interpreter_and_cannot_reach_its_init(probe: Path) -> None:
    program = _program(probe)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        # a rollout in flight while the looking one is forked (its pipes would be there too)
        held = await _hold(host, program, tools)
        seen = _said(await _rollout(host, program, 1, tools, what="look"))
        await _release(host, held)
    finally:
        await host.stop()
        await tools.stop()
    pipes = {fd: d for fd, d in seen["descriptors"].items() if int(fd) > 2}
    # its stdin (the task), stdout, stderr, and one pipe it may only write: its report (step 4)
    assert [d["access"] for d in pipes.values()] == [os.O_WRONLY], pipes
    assert seen["shared_writable"] == []
    assert seen["ptrace_init"] == -1 and seen["init_fds"] == "PermissionError"
    assert seen["procs"] == [1, 2]  # its init (alive: the kill was dropped) and itself


async def test_forged_report_lines_change_nothing_a_later_rollout_sees(probe: Path) -> None:
    """A program writes what it likes on its report pipe: indexes of models the interpreter does not
    have, a line longer than any name, a module that runs as a script when imported. The interpreter
    runs on, runs no script, and a later rollout is as before."""
    program = _program(probe)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        before = _said(await _rollout(host, program, 0, tools, what="look"))
        forged = _said(await _rollout(host, program, 1, tools, what="forge"))
        after = _said(await _rollout(host, program, 2, tools, what="look"))
        assert host.root is not None
        made = sorted(p.name for p in host.root.iterdir())
    finally:
        await host.stop()
        await tools.stop()
    assert len(forged["written"]) == 1 and host.starts == 1
    # no script run (CPython's test runner: it enables faulthandler and rewrites sys.path, for good)
    assert before["scripts"] == after["scripts"] == []
    assert before["faulthandler"] is after["faulthandler"] is False and after["path"] == before["path"]
    assert made == []  # nothing written where the rollouts' folders are made
    assert after["procs"] == [1, 2] and after["shared_writable"] == []


class _Tokens(CaptureModel):
    """A capture with a token of its own per rollout, each remembered."""

    def __init__(self) -> None:
        super().__init__(_answered().record)
        self.tokens: list[str] = []

    async def open_capture(
        self, capture_id: str, *, model: str, sampling: Any, session_id: str
    ) -> CaptureOpened:
        opened = await super().open_capture(capture_id, model=model, sampling=sampling, session_id=session_id)
        self.tokens.append(secrets.token_urlsafe(24))
        return replace(opened, token=self.tokens[-1])


async def test_the_interpreter_keeps_no_capture_token_of_a_rollout_it_forked(probe: Path) -> None:
    """A rollout's process starts as a copy of the interpreter's memory: the capture token of a
    rollout in flight (its capture open, the gateway's port reachable from every rollout) must not
    be left there, or a program forked later could make calls recorded as that rollout's."""
    program = _program(probe)
    host, tools = WarmStart(program), ToolEndpoint()
    held_model = _Tokens()
    try:
        held = await _hold(host, program, tools, held_model)
        # the next rollout forked starts with what the interpreter holds then (the token of the
        # last one forked, its own: the request it read last)
        await _rollout(host, program, 1, tools, what="tls", model=_Tokens())
        assert host._interpreter is not None
        memory = await asyncio.to_thread(_writable_memory, host._interpreter.proc.pid)
        await _release(host, held)
    finally:
        await host.stop()
        await tools.stop()
    assert len(held_model.tokens) == 1 and held_model.tokens[0].encode() not in memory


def _in_folders(root: Path) -> list[int]:
    """The processes working in a rollout's folder under `root`."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/cwd").startswith(f"{root}/"):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


async def test_a_program_that_left_its_process_group_still_times_out_and_leaves_nothing(probe: Path) -> None:
    """No keeper: the interpreter kills a late rollout's process group, its init's; a program that
    made a session of its own (and a child deaf to every signal but SIGKILL) dies with the init's
    pid namespace, and the rollout fails as timed out."""
    program = ProgramSpec(argv=(sys.executable, str(probe)), timeout_s=15.0)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        await _rollout(host, _program(probe), 0, tools, what="tls")  # (the interpreter up: timed apart)
        assert host.root is not None
        root = host.root
        late = asyncio.ensure_future(_rollout(host, program, 1, tools, what="escape"))
        # its init, the program and the deaf child, before the deadline
        await _until(lambda: late.done() or len(_in_folders(root)) == 3, "the program escaped")
        assert not late.done()
        with pytest.raises(AgentProgramTimedOut):
            await late
        await _until(lambda: not _in_folders(root), "the escaped processes gone")
        outcome = await _rollout(host, _program(probe), 2, tools, what="tls")
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == 1 and outcome.program["exit_code"] == 0


async def test_a_program_writing_its_report_without_end_holds_up_no_other_rollout(probe: Path) -> None:
    """The interpreter reads the rollouts' reports between serving forks and exits: one program
    writing its report pipe as fast as it is read must not keep another rollout from starting and
    ending (it waited for the flood's end, and would have timed out behind a longer one)."""
    program = _program(probe)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        floods = [asyncio.ensure_future(_rollout(host, program, n, tools, what="flood")) for n in range(3)]
        await _until(
            lambda: any(f.done() for f in floods) or len(_marked(host, "holding")) == 3, "the floods started"
        )
        other = await _rollout(host, program, 3, tools, what="tls")
        flooding = not any(f.done() for f in floods)
        for folder in _marked(host, "holding"):
            (folder / "go").touch()
        await asyncio.gather(*floods)
    finally:
        await host.stop()
        await tools.stop()
    assert flooding and other.program["exit_code"] == 0 and host.starts == 1


def _cold(script: Path, what: str, folder: Path, **env: str) -> dict[str, Any]:
    """What the probe says run cold (`python probe.py` in `folder`, as the scheduler's user)."""
    variables = {
        k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR", "SSLKEYLOGFILE")
    }
    variables |= {"ROLLMESH_ANSWER_FILE": str(folder / "answer"), **env}
    folder.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script)],
        input=json.dumps({"task": {"what": what}}),
        capture_output=True,
        text=True,
        timeout=60,
        env=variables,
        cwd=folder,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


async def test_a_rollouts_tls_context_is_a_cold_ones_whatever_the_rollout_before_did_to_its_own(
    probe: Path, tmp_path: Path
) -> None:
    """The spare context a rollout is handed (mesh/_warm_ahead.py) is what `ssl` would have made it,
    each rollout's its own (one changed its every setting: the next sees none of it); a program
    that names its own CA file, or asks for a server's context, gets what it asked for."""
    program = _program(probe)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        runs = [_said(await _rollout(host, program, n, tools, what="tls")) for n in range(3)]
        own = _said(await _rollout(host, program, 3, tools, what="tls_own"))
    finally:
        await host.stop()
        await tools.stop()
    cold = _cold(probe, "tls", tmp_path / "cold")
    assert cold["first"]["certs"] > 0 and cold["first"]["verify"] == 2
    assert runs == [{**cold, "path": run["path"]} for run in runs]  # (its own folder on sys.path)
    assert own["own_file"] == _cold(probe, "tls_own", tmp_path / "cold_own")["own_file"]
    assert own["own_file"]["certs"] == 0 and own["server_side"]["verify"] == 0


async def test_a_keylog_file_is_written_where_the_program_would_write_it_cold(
    probe: Path, tmp_path: Path
) -> None:
    """SSLKEYLOGFILE names a file relative to the program's folder: a context made ahead in the
    interpreter would log every rollout's keys to one file in the interpreter's folder (readable by
    the other rollouts' uids), and none where the program looks."""
    program = _program(probe, SSLKEYLOGFILE="keys.log")
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        runs = [_said(await _rollout(host, program, n, tools, what="keylog")) for n in range(2)]
        assert host.root is not None
        shared = (host.root / "keys.log").exists()
    finally:
        await host.stop()
        await tools.stop()
    cold = _cold(probe, "keylog", tmp_path / "cold", SSLKEYLOGFILE="keys.log")
    assert cold["log_in_its_folder"] is True
    for run in runs:
        assert run["log_in_its_folder"] is True and run["first"] == cold["first"]
    assert shared is False


async def test_a_rollout_leaves_no_message_for_another_in_system_v_shared_memory(probe: Path) -> None:
    """System V IPC objects live in an IPC namespace, not in a file system: each rollout has its own
    (with its mount namespace), else a program finds what another left under a key both know."""
    key = 0x5EED0000 + os.getpid() % 0xFFFF
    program = ProgramSpec(argv=(sys.executable, str(probe), str(key)), timeout_s=90)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        left = _said(await _rollout(host, program, 0, tools, what="leave"))
        found = _said(await _rollout(host, program, 1, tools, what="find"))
    finally:
        await host.stop()
        await tools.stop()
        _remove_segment(key)
    assert left["segment"] is True  # (made in its own namespace, gone with it)
    assert found["segment"] is False and "found" not in found


def _remove_segment(key: int) -> None:
    """A segment a rollout left in this host's namespace (the hole this test guards)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(key, 0, 0)
    if shm >= 0:
        libc.shmctl(shm, 0, None)  # IPC_RMID


def _bundle(path: Path, mode: int) -> Path:
    """certifi's CA bundle copied to `path` with `mode` (root's)."""
    import certifi

    path.write_bytes(Path(certifi.where()).read_bytes())
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o644])
async def test_a_ca_file_the_rollouts_uid_cannot_read_gives_it_no_certificate(
    probe: Path, tmp_path: Path, mode: int
) -> None:
    """The interpreter (root) reads a CA file the rollout's uid may not: the rollout's context must
    hold none of it, as its own would (and, readable, all of it)."""
    bundle = _bundle(tmp_path / "ca.pem", mode)
    program = ProgramSpec(
        argv=(sys.executable, str(probe), str(bundle)), env={"SSL_CERT_FILE": str(bundle)}, timeout_s=90
    )
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        runs = [_said(await _rollout(host, program, n, tools, what="ca")) for n in range(2)]
    finally:
        await host.stop()
        await tools.stop()
    for run in runs:
        assert run["readable"] is (mode == 0o644)
        assert (run["certs"] > 100) if mode == 0o644 else (run["certs"] == 0)


OWN_MODULES = {
    "agentpkg/__init__.py": "import os\nUID = os.getuid()\n",
    "agentpkg/main.py": textwrap.dedent(
        """
        import json, os, sys
        import agentpkg, helper, nsp.leaf

        json.load(sys.stdin)
        print(json.dumps({"package": agentpkg.UID, "helper": helper.UID, "leaf": nsp.leaf.UID}))
        open(os.environ["ROLLMESH_ANSWER_FILE"], "w").write("3")
        """
    ),
    "prog.py": "import runpy\nimport nsp.leaf\n\nrunpy.run_module('agentpkg.main', run_name='__main__')\n",
    "helper.py": "import os\nUID = os.getuid()\n",
    "nsp/leaf.py": "import os\nUID = os.getuid()\n",  # (a namespace package: no __init__.py)
}


@pytest.mark.parametrize("shape", ["module", "script"])
async def test_the_programs_own_modules_run_only_in_its_rollouts(tmp_path: Path, shape: str) -> None:
    """`python -m pkg.mod` with the program's folder on PYTHONPATH, or a script beside its modules:
    its package, its modules and a namespace package of its own are imported by each rollout as
    its uid, never by the interpreter as root (their code is the program's, not installed)."""
    folder = agent_script(tmp_path, "prog.py", OWN_MODULES["prog.py"]).parent
    for name, source in OWN_MODULES.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(source)
        (folder / name).parent.chmod(0o755)
    start = ("-m", "agentpkg.main") if shape == "module" else (str(folder / "prog.py"),)
    # (the folder as an argument: bound into the rollout's mounts, as a program's paths are)
    program = ProgramSpec(
        argv=(sys.executable, *start, str(folder)), env={"PYTHONPATH": str(folder)}, timeout_s=90
    )
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        runs = [_said(await _rollout(host, program, n, tools)) for n in range(2)]
    finally:
        await host.stop()
        await tools.stop()
    assert not {"agentpkg", "agentpkg.main", "helper", "nsp", "nsp.leaf"} & set(host.imported)
    for run in runs:
        assert 0 not in run.values(), run


async def test_a_ca_file_rewritten_after_the_interpreter_read_it_is_read_again(
    probe: Path, tmp_path: Path
) -> None:
    """The interpreter made its spare from the CA file as it was; rewritten since (in place: the
    bound file), a rollout's context holds what the file holds now, as its own would."""
    bundle = _bundle(tmp_path / "ca.pem", 0o644)
    program = ProgramSpec(
        argv=(sys.executable, str(probe), str(bundle)), env={"SSL_CERT_FILE": str(bundle)}, timeout_s=90
    )
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        before = _said(await _rollout(host, program, 0, tools, what="ca"))
        _keep_first_certificate(bundle)
        after = _said(await _rollout(host, program, 1, tools, what="ca"))
    finally:
        await host.stop()
        await tools.stop()
    assert before["certs"] > 100 and after["certs"] == 1


def _keep_first_certificate(bundle: Path) -> None:
    text = bundle.read_text()
    end = "-----END CERTIFICATE-----"
    bundle.write_text(text[text.index("-----BEGIN CERTIFICATE-----") : text.index(end) + len(end)] + "\n")


FLAGS = textwrap.dedent(
    """
    import json, os, sys
    json.load(sys.stdin)
    flags = {f: getattr(sys.flags, f) for f in ("optimize", "isolated", "ignore_environment", "no_user_site")}
    here = os.path.dirname(os.path.abspath(__file__))
    print(json.dumps({**flags, "debug": __debug__, "its_folder_first": os.path.abspath(sys.path[0]) == here}))
    open(os.environ["ROLLMESH_ANSWER_FILE"], "w").write("3")
    """
)


@pytest.mark.parametrize("options", [("-O",), ("-I",), ("-E", "-s")])
async def test_a_warm_program_runs_with_the_interpreter_options_it_names(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    """`python -O prog.py` skips its asserts, `python -I` runs isolated, cold: warm too (the
    interpreter is started with the options the program's command line names)."""
    script = agent_script(tmp_path, "flags.py", FLAGS)
    warm = await _one_rollout(ProgramSpec(argv=(sys.executable, *options, str(script)), timeout_s=90))
    assert warm == _cold_flags(script, options, tmp_path / "answer")


async def _one_rollout(program: ProgramSpec) -> dict[str, Any]:
    """What `program` says in a warm job of one rollout."""
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        return _said(await _rollout(host, program, 0, tools))
    finally:
        await host.stop()
        await tools.stop()


def _cold_flags(script: Path, options: tuple[str, ...], answer: Path) -> dict[str, Any]:
    cold = subprocess.run(
        [sys.executable, *options, str(script)],
        input="{}",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ROLLMESH_ANSWER_FILE": str(answer)},
    )
    assert cold.returncode == 0, cold.stderr
    return dict(json.loads(cold.stdout))


CWD_MODULE = textwrap.dedent(
    """
    import json, os, sys
    json.load(sys.stdin)
    with open("made_here.py", "w") as f:
        f.write("X = 3\\n")
    import made_here  # its working folder is first on sys.path, as `python -m` has it
    print(json.dumps({"first": sys.path[0] == os.getcwd(), "x": made_here.X}))
    open(os.environ["ROLLMESH_ANSWER_FILE"], "w").write("3")
    """
)


async def test_a_warm_module_program_finds_its_working_folder_first_on_sys_path(tmp_path: Path) -> None:
    folder = agent_script(tmp_path, "cwd_module.py", CWD_MODULE).parent
    program = ProgramSpec(
        argv=(sys.executable, "-m", "cwd_module", str(folder)), env={"PYTHONPATH": str(folder)}, timeout_s=90
    )
    assert await _one_rollout(program) == {"first": True, "x": 3}
