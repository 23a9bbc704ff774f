"""The fast hosts of external agent programs (scheduler/drivers/): one agent server serving every
rollout (agent_server.py) and per-rollout programs forked from a warm interpreter (warm.py), run for
real (confined as root, as the scheduler's user otherwise) with in-process model and environment
ports: what each request or process gets, how each ends, and what restarts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollmesh.scheduler.drivers.agent_server import MAX_QUICK_DEATHS
from rollmesh.scheduler.drivers.agent_server import AgentServer
from rollmesh.scheduler.drivers.program import CapturedTurn
from rollmesh.scheduler.drivers.program import CaptureRecord
from rollmesh.scheduler.drivers.program import ProgramHost
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.program import run_program
from rollmesh.scheduler.drivers.tool_endpoint import ToolEndpoint
from rollmesh.scheduler.drivers.warm import WarmStart
from rollmesh.scheduler.errors import AgentProgramExited
from rollmesh.scheduler.errors import AgentProgramTimedOut
from rollmesh.scheduler.errors import AgentProgramUnstartable
from rollmesh.scheduler.errors import AgentServerDied
from rollmesh.scheduler.errors import AgentServerFailed
from rollmesh.scheduler.records import RolloutKey
from tests.fakes import LocalEnv
from tests.unit.test_external_agents import SETTINGS
from tests.unit.test_external_agents import TASK
from tests.unit.test_external_agents import CaptureModel
from tests.unit.test_external_agents import _turn

ROOT = os.geteuid() == 0
# The programs below act on the row's `what`: a field the environment marks public (the rest of the
# row never reaches a program).
SHOWN = replace(SETTINGS, public_fields=("what",))
CONFINED = "uid+mount+pid+network" if ROOT else "limits"


def _answered(text: str = "3") -> CaptureModel:
    """A capture that recorded one answered call (as if the program made it)."""
    turn = _turn([1, 2], [3], finish_reason="stop")
    turn.message = {"role": "assistant", "content": text}
    call = CapturedTurn("chat.completions", [{"role": "user", "content": "add 3"}], turn)
    return CaptureModel(CaptureRecord(calls=[call]))


async def _rollout(
    host: ProgramHost,
    program: ProgramSpec,
    n: int,
    tools: ToolEndpoint,
    what: str = "",
    model: CaptureModel | None = None,
) -> Any:
    return await run_program(
        job_id="job",
        key=RolloutKey(0, n),
        task={**TASK, "what": what},
        seed=11,
        settings=SHOWN,
        program=program,
        model=model or _answered(),
        env=LocalEnv(),
        tools=tools,
        host=host,
    )


# -- agent servers -------------------------------------------------------------------------------

SERVER = textwrap.dedent(
    """
    import json, os, time, urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(204)
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            what = body["task"].get("what", "")
            if what == "die":
                os._exit(3)
            if what == "slow":
                time.sleep(30)
            tools = json.load(urllib.request.urlopen(body["tools_url"], timeout=10))
            status, out = 200, {"answer": "3", "request": body, "pid": os.getpid(), "uid": os.getuid(),
                                "tools": sorted(t["function"]["name"] for t in tools["tools"])}
            if what == "fail":
                status, out = 500, {"error": "it broke"}
            data = json.dumps(out).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    ThreadingHTTPServer(("127.0.0.1", int(os.environ["ROLLMESH_AGENT_PORT"])), Handler).serve_forever()
    """
)


@pytest.fixture
def server_program(tmp_path: Path) -> ProgramSpec:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    os.chmod(tmp_path, 0o755)
    return ProgramSpec(argv=(sys.executable, str(script)), timeout_s=60)


async def test_one_agent_server_serves_every_rollout_with_the_rollouts_own_urls(
    server_program: ProgramSpec,
) -> None:
    host, tools = AgentServer(), ToolEndpoint()
    try:
        outcomes = await asyncio.gather(*(_rollout(host, server_program, n, tools) for n in range(3)))
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == 1
    replies = [json.loads(o.program["stdout"]) for o in outcomes]
    assert len({r["pid"] for r in replies}) == 1  # one process served them all
    urls = {r["request"]["tools_url"] for r in replies}
    assert len(urls) == 3 and {r["request"]["api_key"] for r in replies} == {"capture-token"}
    for outcome, reply in zip(outcomes, replies, strict=True):
        request = reply["request"]
        assert set(request) == {
            "messages",
            "tools",
            "task",
            "max_steps",
            "tools_url",
            "base_url",
            "api_key",
            "model",
        }
        assert request["base_url"] == "http://127.0.0.1:9/capture/k/v1"  # the rollout's capture
        assert request["messages"] == [{"role": "user", "content": "add 3"}]
        assert reply["tools"] == ["get_count", "increment"]  # its own tools URL, reached from its namespace
        assert outcome.program["mode"] == "server" and outcome.program["sandbox"] == CONFINED
        assert outcome.program["answer_file"] is True  # the reply's answer is verified
        assert outcome.messages[-1] == {"role": "assistant", "content": "3"}
    if ROOT:
        assert 65000 <= replies[0]["uid"] <= 65533 and replies[0]["pid"] == 2  # (pid 1: its init)


async def test_a_server_that_dies_fails_its_rollout_retryably_and_the_next_starts_it_again(
    server_program: ProgramSpec,
) -> None:
    host, tools = AgentServer(), ToolEndpoint()
    try:
        await _rollout(host, server_program, 0, tools)
        with pytest.raises(AgentServerDied) as died:
            await _rollout(host, server_program, 1, tools, what="die")
        assert died.value.reason == "AGENT_SERVER_DIED" and "exit 3" in died.value.message
        assert died.value.code.name == "UNAVAILABLE"  # retried (retry.py)
        outcome = await _rollout(host, server_program, 2, tools)
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == 2 and outcome.program["exit_code"] == 0


async def test_an_error_reply_fails_the_rollout_and_a_slow_one_times_out_while_the_server_stays(
    server_program: ProgramSpec,
) -> None:
    host, tools = AgentServer(), ToolEndpoint()
    quick = ProgramSpec(argv=server_program.argv, timeout_s=2.0)
    try:
        with pytest.raises(AgentServerFailed, match=r"answered 500 to the rollout's /run: .*it broke"):
            await _rollout(host, server_program, 0, tools, what="fail")
        await _rollout(host, server_program, 1, tools)  # (up: the short deadline is for /run only)
        with pytest.raises(AgentProgramTimedOut):
            await _rollout(host, quick, 2, tools, what="slow")
        await _rollout(host, server_program, 3, tools)
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == 1


async def test_a_server_that_never_comes_up_is_unstartable_after_a_few_tries(tmp_path: Path) -> None:
    program = ProgramSpec(argv=("sh", "-c", "echo cannot bind >&2; exit 2"), timeout_s=30)
    host, tools = AgentServer(), ToolEndpoint()
    try:
        for n in range(MAX_QUICK_DEATHS):
            with pytest.raises(AgentServerDied, match=r"exited before it was up \(exit 2: cannot bind\)"):
                await _rollout(host, program, n, tools)
        with pytest.raises(AgentProgramUnstartable, match=r"3 times in a row .*cannot bind"):
            await _rollout(host, program, 9, tools)
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == MAX_QUICK_DEATHS


# -- warm start ----------------------------------------------------------------------------------

PROGRAM = textwrap.dedent(
    """
    import sys
    loaded = {m: m in sys.modules for m in ("email.mime.text", "xml.dom.minidom", "mine")}
    import json, os
    import email.mime.text

    def later():
        import xml.dom.minidom  # not at its top level: not imported ahead

    task = json.load(sys.stdin)
    print(json.dumps({"loaded": loaded, "uid": os.getuid(), "pid": os.getpid(), "cwd": os.getcwd(),
                      "argv": sys.argv, "env": sorted(os.environ),
                      "messages": task["messages"],
                      "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                      "folders": os.listdir(os.path.dirname(os.path.dirname(os.getcwd())))}))
    sys.stdout.flush()
    what = task["task"].get("what", "")
    if what == "exit":
        print("broke", file=sys.stderr)
        sys.exit(3)
    if what == "raise":
        raise RuntimeError("no luck")
    if what == "kill":
        os.kill(os.getpid(), 9)
    if what == "term":
        import signal
        signal.raise_signal(signal.SIGTERM)
    if what == "abort":
        os.abort()
    if what == "slow":
        import time
        time.sleep(30)
    if what == "lazy":
        later()
        open("mine.py", "w").write("X = 1")
        sys.path.insert(0, os.getcwd())
        import mine  # a module of its own making, in its folder
    open(os.environ["ROLLMESH_ANSWER_FILE"], "w").write("3")
    """
)


def agent_script(tmp_path: Path, name: str, source: str) -> Path:
    """`source` as tmp_path/agent/`name`, in folders a rollout's uid may enter."""
    folder = tmp_path / "agent"
    folder.mkdir()
    (folder / name).write_text(source)
    os.chmod(tmp_path, 0o755)
    os.chmod(folder, 0o755)
    return folder / name


@pytest.fixture
def warm_script(tmp_path: Path) -> Path:
    return agent_script(tmp_path, "prog.py", PROGRAM)


def _warm(script: Path, *args: str, timeout_s: float = 60) -> ProgramSpec:
    return ProgramSpec(argv=(sys.executable, str(script), *args), timeout_s=timeout_s)


async def test_a_warm_program_runs_with_its_imports_done_each_rollout_confined_on_its_own(
    warm_script: Path,
) -> None:
    program = _warm(warm_script, "ok")
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        outcomes = await asyncio.gather(*(_rollout(host, program, n, tools) for n in range(3)))
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == 1
    assert "email.mime.text" in host.imported and "xml.dom.minidom" not in host.imported
    seen = [json.loads(o.program["stdout"]) for o in outcomes]
    for outcome, run in zip(outcomes, seen, strict=True):
        assert run["loaded"] == {"email.mime.text": True, "xml.dom.minidom": False, "mine": False}
        assert run["argv"] == [str(warm_script), "ok"]
        assert run["messages"] == [{"role": "user", "content": "add 3"}]
        assert "ROLLMESH_API_KEY" not in run["env"] and "OPENAI_BASE_URL" in run["env"]
        assert outcome.program["mode"] == "warm" and outcome.program["sandbox"] == CONFINED
        assert outcome.program["answer_file"] is True and outcome.program["exit_code"] == 0
        assert not Path(run["cwd"]).exists()  # noqa: ASYNC240 - its folder is removed
    if ROOT:
        assert len({r["uid"] for r in seen}) == 3 and all(r["pid"] == 2 for r in seen)
        assert all(r["procs"] == [1, 2] for r in seen)  # its init and itself, nothing else
        assert all(len(r["folders"]) == 1 for r in seen)  # its own folder, no other rollout's


async def test_a_warm_interpreter_learns_the_installed_modules_its_rollouts_import_late(
    warm_script: Path,
) -> None:
    """A module a rollout imported late (in a function) is imported ahead for the rollouts after
    it, when it is installed outside the program's folder; a module the program made never is."""
    program = _warm(warm_script, "ok")
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        first = await _rollout(host, program, 0, tools, what="lazy")
        second = await _rollout(host, program, 1, tools)
    finally:
        await host.stop()
        await tools.stop()
    assert json.loads(first.program["stdout"])["loaded"]["xml.dom.minidom"] is False
    loaded = json.loads(second.program["stdout"])["loaded"]
    assert loaded == {"email.mime.text": True, "xml.dom.minidom": True, "mine": False}


async def test_a_warm_program_fails_as_it_would_cold(warm_script: Path) -> None:
    program = _warm(warm_script)
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        with pytest.raises(AgentProgramExited, match=r"exited with 3 .*broke"):
            await _rollout(host, program, 0, tools, what="exit")
        with pytest.raises(AgentProgramExited, match=r"exited with 1 .*RuntimeError: no luck"):
            await _rollout(host, program, 1, tools, what="raise")
        for n, (what, name) in enumerate((("kill", "SIGKILL"), ("term", "SIGTERM"), ("abort", "SIGABRT"))):
            with pytest.raises(AgentProgramExited, match=rf"killed by {name}"):
                await _rollout(host, program, 4 + n, tools, what=what)
        with pytest.raises(AgentProgramTimedOut):
            await _rollout(host, _warm(warm_script, timeout_s=2.0), 2, tools, what="slow")
        outcome = await _rollout(host, program, 3, tools)
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == 1 and outcome.program["exit_code"] == 0


async def test_a_warm_interpreter_that_died_is_started_again(warm_script: Path) -> None:
    program = _warm(warm_script, "ok")
    host, tools = WarmStart(program), ToolEndpoint()
    try:
        await _rollout(host, program, 0, tools)
        interpreter = host._interpreter
        assert interpreter is not None
        os.killpg(interpreter.proc.pid, signal.SIGKILL)
        await interpreter.proc.wait()
        outcome = await _rollout(host, program, 1, tools)
    finally:
        await host.stop()
        await tools.stop()
    assert host.starts == 2 and outcome.program["exit_code"] == 0


async def test_a_program_that_cannot_start_warm_is_unstartable(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import json\n")
    program = ProgramSpec(argv=(sys.executable, "-X", "nonsense-option-x", str(tmp_path / "broken.py")))
    with pytest.raises(ValueError, match=r"a warm start needs"):
        WarmStart(program)
    missing = ProgramSpec(argv=("/nonexistent/python3", str(tmp_path / "broken.py")), timeout_s=30)
    host, tools = WarmStart(missing), ToolEndpoint()
    try:
        with pytest.raises(AgentProgramUnstartable, match=r"cannot start the agent program"):
            await _rollout(host, missing, 0, tools)
    finally:
        await host.stop()
        await tools.stop()
