"""Running untrusted Python against tests: a separate process per run, in a fresh temp dir.

Isolation is decided once at start and logged (`sandbox_isolation`, or the warning
`sandbox_isolation_unsafe`). Without OS-level isolation, `start` raises, naming what is missing,
unless the operator set ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS=1:

- `namespaces` (when the kernel lets us `unshare` mount, net, pid, ipc and uts namespaces): the
  run sees a chroot built from a tmpfs holding read-only, nosuid binds of /usr (and /lib*, /bin) and the
  Python prefix, with a tmpfs of `fsize_mb` as /sandbox (all it may write: files written to the
  host's disk filled it at ~1 GB/s of CPU); no network interface but loopback; its own pid
  namespace, so killing the outer process kills every descendant (fork bombs included); as root
  the code runs as a uid/gid of its own (`SANDBOX_UIDS`), which makes RLIMIT_NPROC bite and the
  service's files unreadable.
- `process` (the UNSAFE opt-in): a plain child in a new session, an empty environment, cwd in the
  temp dir, and the runner's guards (no sockets, no fork/exec, no files outside the temp dir:
  bypassable). A keeper (a child subreaper) runs the runner and, at the end, SIGKILLs every
  descendant, daemons included. As root the keeper stays root and the runner becomes the run's
  own uid, so the code can neither kill the keeper or a concurrent run nor read the service's /proc
  files. As non-root there is
  no such guarantee: the code can kill the keeper, read the service's environment through /proc,
  and signal it. No network isolation in either case.

A run of assert tests has a second sandboxed process, the clean interpreter where the verdict is
computed (verifier/sandbox/checks.py): a child forked, per run, by a pre-started clean interpreter
(`_Zygote`, one per concurrent run, in a sandbox and under a uid of its own for its life, that only
ever runs the runner's own code and forks one run at a time; after each it kills what the child
left and empties its directory). One whose run did not end as the protocol says is stopped and
replaced. `aclose` stops them.

In `namespaces` mode as root, the solution's process is forked too: by a pre-started sandbox per
slot (`forker.Forker`, root in its chroot and pid 1 of its namespaces) that mounts a fresh
tmpfs as /sandbox per run and forks a child holding only the run's pipes, which drops to the run's
uid; at the end of the run every other process of the namespace is killed. A forker that does not
end a run as its protocol says is stopped and replaced. Elsewhere each run starts a sandbox.

A run whose sandbox never came up (the runner did not answer its "hello", which it does before
any of the code is read: unshare/mount/chroot failed, or the host was too loaded to start it within
the wall-clock limit) raises `SandboxUnavailable`: nobody ran the code, so there is no verdict, and
callers must fail the verify (retryable) rather than score it 0. Everything after the hello is
the code's doing and ends in a `RunResult`.

A run that the host's other work kept from a CPU so long that it did not get its wall-clock time
within 4x the limit raises `SandboxStarved` (a `SandboxUnavailable`, timed out): its outcome is
unknown. The wall-clock limit counts the time the code could run (verifier/sandbox/clock.py).

Always: rlimits (CPU, address space, file size, processes, core 0), a wall-clock timeout, an
empty environment (no ROLLMESH_API_KEY), output kept up to a cap (the rest is dropped), and a
semaphore bounding concurrent runs. As root, each concurrent run has a uid of its own, leased
host-wide so that other verifiers' runs do not share it (mesh/uids.py): runs share
no RLIMIT_NPROC budget (a fork bomb in one cannot keep another from starting or forking) and, in
`process` mode, cannot signal each other (a run that killed its neighbour's runner scored that
neighbour's answer 0). Spawning uses asyncio subprocesses; nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from dataclasses import replace
from pathlib import Path
from typing import Any

from rollmesh.mesh.aio import read_capped
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.uids import PROBE_UID
from rollmesh.mesh.uids import SANDBOX_UIDS
from rollmesh.mesh.uids import UidPool
from rollmesh.verifier import telemetry
from rollmesh.verifier.config import SandboxConfig
from rollmesh.verifier.config import SandboxLimits
from rollmesh.verifier.errors import BadValue
from rollmesh.verifier.errors import CaseFailed
from rollmesh.verifier.errors import ChannelBroken
from rollmesh.verifier.errors import SandboxStarved
from rollmesh.verifier.errors import SandboxUnavailable
from rollmesh.verifier.sandbox._sandbox_runner import CPU_LIMIT_EXIT
from rollmesh.verifier.sandbox.checks import Relay
from rollmesh.verifier.sandbox.checks import names_used
from rollmesh.verifier.sandbox.checks import normalize_output
from rollmesh.verifier.sandbox.clock import STARVED_AFTER
from rollmesh.verifier.sandbox.clock import WallCredit
from rollmesh.verifier.sandbox.clock import run_within_wall_time
from rollmesh.verifier.sandbox.forker import Forked
from rollmesh.verifier.sandbox.forker import Forker
from rollmesh.verifier.sandbox.values import parse_frame

log = get_logger("rollmesh.verifier.sandbox.core")

RUNNER = Path(__file__).with_name("_sandbox_runner.py")
CLEAN = Path(__file__).with_name("_clean_runner.py")
UNSAFE_OPT_IN = "ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS"
MAX_REPLY_BYTES = 4 * 1024 * 1024
MAX_CASES_REPORTED = 50
MAX_ERROR_CHARS = 300
_CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/sandbox"}

# Runs as root inside the new namespaces; builds the chroot and drops privileges.
_NS_SCRIPT = r"""
set -e
R=$1; W=$2; PFX=$3; PY=$4; RUN_UID=$5; DISK_MB=$6; ROLE=$7
mount -t tmpfs -o size=4m,mode=755 sbxroot "$R"
for d in usr bin sbin lib lib32 lib64; do
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$R/$d"
  elif [ -d "/$d" ]; then
    mkdir "$R/$d"; mount --rbind "/$d" "$R/$d"
    mount -o remount,bind,ro,nosuid,nodev "$R/$d" 2>/dev/null || true
  fi
done
case "$PFX" in
  /usr/*|/usr) ;;
  *) mkdir -p "$R$PFX"; mount --rbind "$PFX" "$R$PFX"
     mount -o remount,bind,ro,nosuid,nodev "$R$PFX" 2>/dev/null || true ;;
esac
mkdir -p "$R/sandbox" "$R/dev"
mount -t tmpfs -o "size=${DISK_MB}m,mode=700,nosuid,nodev" sbxwork "$R/sandbox"
cp "$W"/*.py "$R/sandbox/"
if [ -n "$RUN_UID" ]; then chown -R "$RUN_UID:$RUN_UID" "$R/sandbox"; fi
for n in null zero urandom random; do
  touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"
done
RUN='cd /sandbox && exec "$0" -I -S -B runner.py "$1"'
if [ -n "$RUN_UID" ]; then exec chroot --userspec="$RUN_UID:$RUN_UID" "$R" /bin/sh -c "$RUN" "$PY" "$ROLE"; fi
exec chroot "$R" /bin/sh -c "$RUN" "$PY" "$ROLE"
"""


# What a namespaces run must show before the mode is trusted (statvfs flags: 1 ro, 2 nosuid).
_PROBE_CHECKS = {
    "a run does not complete": "assert x == 1",
    "/usr is not read-only and nosuid in the chroot": "assert os.statvfs('/usr').f_flag & 3 == 3",
    "the Python prefix is not read-only and nosuid": "assert os.statvfs(sys.base_prefix).f_flag & 3 == 3",
}


@dataclass(frozen=True)
class TestSpec:
    """`asserts`: each case is Python source run after the solution (shared globals).
    `io`: each case is {"input", "output"}; the solution runs as __main__ with that stdin."""

    __test__ = False  # not a pytest class

    kind: str
    cases: list[Any]


@dataclass(frozen=True)
class _Job:
    """What one run runs: the code, its tests, its limits, and whether the Python-level guards
    are on."""

    code: str
    tests: TestSpec
    limits: SandboxLimits
    guards: bool = True


@dataclass
class RunResult:
    status: str  # "ok" (every case has a verdict), "timeout", "crashed" (the channel broke)
    passed: int = 0
    # Why a case can give no verdict whatever the solution does ("" when every case could).
    unverifiable: str = ""
    total: int = 0
    cases: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output_truncated: bool = False
    duration_s: float = 0.0
    # Seconds the run was given past wall_s for the time it waited for a CPU (clock.py).
    cpu_wait_credit_s: float = 0.0
    isolation: str = ""

    def summary(self, max_chars: int = 2000) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}  # not asdict: no deep copy
        out["cases"] = [dict(case) for case in self.cases]
        out["stdout"] = self.stdout[:max_chars]
        out["stderr"] = self.stderr[-max_chars:]
        return out


class Sandbox:
    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.isolation = ""
        self._slots = asyncio.Semaphore(config.concurrency)
        self._uids = UidPool()
        self._idle: list[_Zygote] = []  # pre-started clean interpreters, one run at a time each
        self._forkers: list[Forker] = []  # pre-started solution sandboxes (forker.py), idle
        self._zygote_groups: set[int] = set()  # their process groups, killed when this is collected
        self._closed = False
        weakref.finalize(self, _kill_groups, self._zygote_groups)
        self._drop_privileges = os.geteuid() == 0
        self._process_python = _world_usable_python() if self._drop_privileges else None

    # -- isolation probe ------------------------------------------------------------------------------

    async def start(self) -> str:
        """Decide the isolation mode and log it. Raises ConfigError, naming what is missing, rather
        than run untrusted code without OS-level isolation, unless the operator opted in
        (`allow_unsafe_process`). Idempotent."""
        if self.isolation:
            return self.isolation
        if self._drop_privileges:
            await asyncio.to_thread(self._uids.use_leases)
        why = ""
        if self.config.isolation != "process":
            ok, why = await self.probe()
            if ok:
                self.isolation = "namespaces"
            elif self.config.isolation == "namespaces" or not self.config.allow_unsafe_process:
                raise ConfigError(_missing_isolation(why))
        if not self.isolation:
            if not self.config.allow_unsafe_process:
                raise ConfigError(
                    "ROLLMESH_VERIFIER_SANDBOX_ISOLATION=process runs untrusted code under Python-level "
                    f"guards only; set {UNSAFE_OPT_IN}=1 to accept that, or use auto or namespaces"
                )
            self.isolation = "process"
        fields: dict[str, Any] = {
            "mode": self.isolation,
            "uids": f"{SANDBOX_UIDS[-1]}-{SANDBOX_UIDS[0]}"
            if self._drop_privileges and (self.isolation == "namespaces" or self._process_python)
            else str(os.geteuid()),
            "limits": asdict(self.config.limits),
        }
        if self.isolation == "namespaces":
            log.info("sandbox_isolation", **fields)
        else:
            log.warning(
                "sandbox_isolation_unsafe",
                **fields,
                opted_in_by=f"{UNSAFE_OPT_IN}=1",
                namespaces_unavailable=why or "not tried (isolation=process)",
                guarantees=self.guarantees,
            )
        return self.isolation

    @property
    def label(self) -> str:
        """The mode as ListEnvironments and `rollmesh status` show it ("" before `start`)."""
        return "unsafe-process" if self.isolation == "process" else self.isolation

    @property
    def guarantees(self) -> str:
        if self.isolation == "namespaces":
            return "kernel: own mount/pid/net/ipc/uts namespaces, chroot, a uid per run, rlimits"
        if self._drop_privileges and self._process_python:
            return "a uid per run, rlimits, every descendant killed; no network or filesystem isolation"
        return "none beyond rlimits and Python-level guards: the code runs as the service's user"

    async def probe(self) -> tuple[bool, str]:
        """Whether a namespaces run works here, and if not, why."""
        if not sys.platform.startswith("linux") or shutil.which("unshare") is None:
            return False, "unshare(1) not available"
        limits = replace(self.config.limits, wall_s=20.0, cpu_s=10)
        checks = dict(_PROBE_CHECKS)
        if self._drop_privileges:
            checks[f"the code does not run as uid {PROBE_UID}"] = f"assert os.getuid() == {PROBE_UID}"
        tests = TestSpec("asserts", list(checks.values()))
        try:
            code = "import os, sys\nx = 1"
            res = await self._run_once(
                _Job(code, tests, limits), "namespaces", PROBE_UID, clean_uid=PROBE_UID
            )
        except (OSError, SandboxUnavailable) as exc:
            return False, str(exc)[-300:]
        if res.status != "ok":
            return False, (res.error or res.stderr.strip() or res.status)[-300:]
        failed = [why for why, case in zip(checks, res.cases, strict=False) if not case.get("ok")]
        return (False, "; ".join(failed)) if failed else (True, "")

    # -- runs -----------------------------------------------------------------------------------------

    async def run(
        self, code: str, tests: TestSpec, *, limits: SandboxLimits | None = None, guards: bool = True
    ) -> RunResult:
        """Run `code` against `tests` under the limits; never raises for anything the code does.
        Raises `SandboxUnavailable` when the sandbox never came up (the code did not run)."""
        mode = await self.start()
        async with self._slots:
            uid = await self._uids.lease()
            result = "unavailable"
            try:
                job = _Job(code, tests, limits or self.config.limits, guards)
                run = await self._run_once(job, mode, uid)
                result = run.status
                return run
            finally:
                self._uids.release(uid)
                telemetry.SANDBOX_RUNS.labels(result).inc()

    async def aclose(self) -> None:
        """Stop the pre-started clean interpreters (a run in progress stops its own when it ends)."""
        self._closed = True
        idle, self._idle = self._idle, []
        forkers, self._forkers = self._forkers, []
        await asyncio.gather(
            *(self._release_clean(z, reuse=False) for z in idle),
            *(self._release_forker(f, reuse=False) for f in forkers),
        )

    async def _clean_interpreter(self, mode: str, limits: SandboxLimits, uid: int | None) -> _Zygote:
        """An idle pre-started clean interpreter, else a new one (greeted by the run that gets it).
        With `uid` (the probe's), always a new one, never kept."""
        loop = asyncio.get_running_loop()
        while uid is None and self._idle:
            zygote = self._idle.pop()
            if zygote.loop is not loop:  # its pipes belong to another event loop: unusable here
                _kill_groups({zygote.proc.proc.pid})
                self._zygote_groups.discard(zygote.proc.proc.pid)
                if zygote.uid is not None:
                    self._uids.release(zygote.uid)
                continue
            if zygote.proc.proc.returncode is None:
                return zygote
            await self._release_clean(zygote, reuse=False)
        leased = uid is None
        run_uid = await self._uids.lease() if uid is None else uid
        stack = contextlib.AsyncExitStack()
        try:
            proc = await stack.enter_async_context(self._process(mode, limits, run_uid, "--clean"))
            assert proc.proc.stdin is not None
            channel = await Channel.open(proc.proc.stdin, proc.reply_fd, max_frame=MAX_REPLY_BYTES)
        except BaseException:
            await stack.aclose()
            if leased:
                self._uids.release(run_uid)
            raise
        drain = asyncio.gather(read_capped(proc.proc.stdout, 0), read_capped(proc.proc.stderr, 0))
        drain.add_done_callback(_retrieved)
        self._zygote_groups.add(proc.proc.pid)
        return _Zygote(proc, channel, stack, run_uid if leased else None, drain, mode, loop)

    async def _release_clean(self, zygote: _Zygote, *, reuse: bool) -> None:
        """Keep a clean interpreter whose run ended as the protocol says; stop any other."""
        if reuse and not self._closed and zygote.uid is not None and zygote.proc.proc.returncode is None:
            self._idle.append(zygote)
            return
        zygote.channel.close()
        await self._stop(zygote.proc.proc, keeper=zygote.mode == "process")
        self._zygote_groups.discard(zygote.proc.proc.pid)
        zygote.drain.cancel()
        with contextlib.suppress(BaseException):
            await zygote.drain
        await zygote.stack.aclose()
        if zygote.uid is not None:
            self._uids.release(zygote.uid)

    def _command(self, mode: str, root: Path, work: Path, limits: SandboxLimits, uid: int) -> list[str]:
        """The command line of a sandboxed process; its role (`--solution`, `--clean`) is appended."""
        py = _service_python()
        if mode == "process":
            return [self._process_python or py, "-I", "-S", "-B", "runner.py", "--keeper"]
        prefix = os.path.realpath(sys.base_prefix)
        flags = ["--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
        if os.geteuid() != 0:
            flags[:0] = ["--user", "--map-root-user"]
        drop = str(uid) if self._drop_privileges and uid else ""  # 0: a forker, root in its chroot
        return [
            "unshare",
            *flags,
            "--",
            "/bin/sh",
            "-c",
            _NS_SCRIPT,
            "sh",
            str(root),
            str(work),
            prefix,
            py,
            drop,
            str(limits.fsize_mb + 1),  # what the run may write in all; +1 for the runner's files
        ]

    async def _run_once(self, job: _Job, mode: str, uid: int, *, clean_uid: int | None = None) -> RunResult:
        """One run: the solution's process, a sandbox of its own, and for assert tests a child of a
        pre-started clean interpreter (`_Zygote`), in a sandbox and under a uid of its own."""
        start = time.monotonic()
        clean: _Zygote | None = None
        healthy = False
        try:
            if self._forks(mode):
                result = await self._run_forked(job, mode, uid, clean_uid)
            else:
                async with self._process(mode, job.limits, uid, "--solution") as proc:
                    if job.tests.kind == "asserts":
                        clean = await self._clean_interpreter(mode, job.limits, clean_uid)
                    spawned = _Spawned(
                        proc.proc, proc.reply_fd, proc.child_fd, proc.drop_to, mode == "process"
                    )
                    result, healthy = await self._supervise(spawned, clean, job)
        finally:
            if clean is not None:
                await self._release_clean(clean, reuse=healthy)
        result.isolation = mode
        result.duration_s = round(time.monotonic() - start, 4)
        return result

    def _forks(self, mode: str) -> bool:
        """Whether runs' solution processes are forked by pre-started sandboxes (forker.py):
        in `namespaces` mode as root, where the forker can stay root and give each run its uid."""
        return mode == "namespaces" and self._drop_privileges

    async def _run_forked(self, job: _Job, mode: str, uid: int, clean_uid: int | None) -> RunResult:
        """`_run_once` with the solution's process forked by a `Forker` (kept when it ended the run
        as its protocol says); its clean interpreter as `_run_once` has it."""
        forker = await self._forker(mode, job.limits, keep=clean_uid is None)
        clean: _Zygote | None = None
        healthy = False
        try:
            try:
                # The size a fresh run has (`_command`).
                main = await forker.fork(uid, job.limits.fsize_mb + 1)
            except ChannelBroken as exc:
                why = await _head(forker.drain)
                raise SandboxUnavailable(
                    f"the sandbox did not start ({exc}): {why}", timed_out=False
                ) from None
            try:
                if job.tests.kind == "asserts":
                    try:
                        clean = await self._clean_interpreter(mode, job.limits, clean_uid)
                    except BaseException:
                        main.discard()
                        raise
                result, healthy = await self._supervise(main, clean, job)
            finally:
                await main.stop()
        finally:
            if clean is not None:
                await self._release_clean(clean, reuse=healthy)
            await self._release_forker(forker, reuse=forker.usable)
        return result

    async def _forker(self, mode: str, limits: SandboxLimits, *, keep: bool) -> Forker:
        """An idle pre-started solution sandbox, else a new one, up (`keep` false: the probe's, never
        kept). Raises `SandboxUnavailable` when a new one does not come up."""
        loop = asyncio.get_running_loop()
        while keep and self._forkers:
            forker = self._forkers.pop()
            if forker.loop is not loop:  # its pipes belong to another event loop: unusable here
                _kill_groups({forker.proc.pid})
                self._zygote_groups.discard(forker.proc.pid)
                continue
            if forker.proc.returncode is None and forker.usable:
                return forker
            await self._release_forker(forker, reuse=False)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        stack = contextlib.AsyncExitStack()
        try:
            role = f"--solutions={theirs.fileno()}"
            proc = await stack.enter_async_context(self._process(mode, limits, 0, role, (theirs.fileno(),)))
        except BaseException:
            ours.close()
            await stack.aclose()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        os.close(proc.reply_fd)  # a forker answers on its control socket
        assert proc.proc.stdin is not None
        proc.proc.stdin.close()
        drain = asyncio.gather(read_capped(proc.proc.stdout, 0), read_capped(proc.proc.stderr, 4096))
        drain.add_done_callback(_retrieved)
        self._zygote_groups.add(proc.proc.pid)
        forker = Forker(proc.proc, ours, stack, drain, loop, keep)
        # Up before the run's clock starts: its start is not the code's time (clock.py)
        try:
            async with asyncio.timeout(limits.wall_s * STARVED_AFTER):
                await forker.ready()
        except (ChannelBroken, TimeoutError) as exc:
            timed_out = isinstance(exc, TimeoutError)
            why = "" if timed_out else await _head(forker.drain)
            await self._release_forker(forker, reuse=False)
            error = f"not up within {limits.wall_s * STARVED_AFTER:g}s" if timed_out else str(exc)
            raise SandboxUnavailable(
                f"the sandbox did not start ({error}): {why}", timed_out=timed_out
            ) from None
        return forker

    async def _release_forker(self, forker: Forker, *, reuse: bool) -> None:
        if reuse and forker.keep and not self._closed and forker.proc.returncode is None:
            self._forkers.append(forker)
            return
        forker.usable = False
        forker.control.close()
        await self._stop(forker.proc, keeper=False)
        self._zygote_groups.discard(forker.proc.pid)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await asyncio.wait({forker.drain})
        forker.drain.cancel()
        await forker.stack.aclose()

    @contextlib.asynccontextmanager
    async def _process(
        self, mode: str, limits: SandboxLimits, uid: int, role: str, fds: tuple[int, ...] = ()
    ) -> AsyncIterator[_Proc]:
        """A started sandboxed process (its temp dir removed when it is left); `fds` are passed on."""
        base = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="rollmesh-sbx-"))
        reply_r, reply_w = os.pipe()
        try:
            work, root = base / "work", base / "root"
            await asyncio.to_thread(self._prepare, base, work, root, uid)
            proc = await asyncio.create_subprocess_exec(
                *self._command(mode, root, work, limits, uid),
                role,
                cwd=str(work),
                env=dict(_CLEAN_ENV),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(reply_w, *fds),
                start_new_session=True,
            )
            child_fd, reply_w = reply_w, -1
            os.close(child_fd)
            read_fd, reply_r = reply_r, -1  # the channel's transport owns it from here
            yield _Proc(proc, read_fd, child_fd, self._drop_to(mode, uid))
        finally:
            for fd in (reply_r, reply_w):
                if fd >= 0:
                    os.close(fd)
            await asyncio.to_thread(shutil.rmtree, base, True)

    def _prepare(self, base: Path, work: Path, root: Path, uid: int) -> None:
        """The run's directory holds only the runners: code, inputs and tests arrive over stdin."""
        work.mkdir()
        root.mkdir()
        shutil.copyfile(RUNNER, work / "runner.py")
        shutil.copyfile(CLEAN, work / "clean.py")
        if self._drop_privileges:
            os.chown(work, uid, uid)
            os.chmod(work, 0o700)
            os.chmod(base, 0o711)  # traversable by the sandbox user in `process` mode, not listable
        else:
            os.chmod(base, 0o700)

    def _drop_to(self, mode: str, uid: int) -> int | None:
        """In `process` mode as root, the runner switches to the run's uid/gid (no supplementary groups)
        before any code runs, when an interpreter that user can run exists (`_world_usable_python`).
        Not through Popen's `user=`: that forks without vfork, and grpc's fork handlers crash the child."""
        if mode == "process" and self._drop_privileges and self._process_python:
            return uid
        return None

    async def _supervise(
        self, main: _Spawned | Forked, clean: _Zygote | None, job: _Job
    ) -> tuple[RunResult, bool]:
        """The run's result, and whether its clean interpreter ended as the protocol says."""
        tests, limits, guards = job.tests, job.limits, job.guards
        cap = limits.output_kb * 1024
        readers = asyncio.gather(read_capped(main.stdout, cap), read_capped(main.stderr, cap))
        channel = await Channel.open(main.stdin, main.reply_fd, max_frame=max(cap, MAX_REPLY_BYTES))
        channels = [channel] if clean is None else [channel, clean.channel]
        others = [] if clean is None else [clean.proc.proc]
        expected = 1 + len(others) + isinstance(main, Forked)  # greetings: each process is up
        verdicts: list[dict[str, Any]] = []
        status, error = "ok", ""
        greetings: list[asyncio.Future[Any]] = []
        credit = WallCredit()
        unverifiable: list[str] = []
        healthy = False

        async def talk() -> str:
            nonlocal healthy
            hello = await channel.send(
                "hello",
                reply_fd=main.child_fd,
                limits=_limits_fields(limits),
                guards=guards,
                drop_to=main.drop_to,
            )
            # The runner answers hello before it reads the code: its reply, awaited while the code
            # is still being written (pipelined), says the sandbox came up.
            greetings.append(asyncio.ensure_future(channel.receive(hello)))
            if isinstance(main, Forked):
                greetings.append(asyncio.ensure_future(main.started()))
            if clean is not None:
                greetings.append(asyncio.ensure_future(clean.fork(limits, guards)))
            load = await channel.send("load", code=job.code, mode=tests.kind)
            await asyncio.gather(*greetings)
            error, ended = await _judge(channels, await channel.receive(load), tests, verdicts, unverifiable)
            if clean is not None:
                if not ended:
                    await clean.channel.receive(await clean.channel.send("exit"))
                healthy = True
            return error

        try:
            # The time the solution's process waited for a CPU is credited (clock.py); the
            # clean interpreter's session holds its pre-started parent too, whose CPU is not the run's
            pid, skip = main.clock
            error = await run_within_wall_time(talk(), pid, limits.wall_s, credit, skip)
        except TimeoutError:
            status = "timeout"
            error = f"wall-clock limit of {limits.wall_s:g}s exceeded; process group killed"
        except SandboxStarved as exc:
            status, error = "starved", str(exc)
        except ChannelBroken as exc:
            status, error = "crashed", str(exc)
            with contextlib.suppress(TimeoutError):  # let them exit on their own: the status says why
                async with asyncio.timeout(1.0):
                    await asyncio.gather(*(p.wait() for p in others), main.wait())
            if any(p.returncode == CPU_LIMIT_EXIT for p in [main, *others]):
                status = "timeout"
                error = f"CPU-time limit of {limits.cpu_s}s exceeded; process group killed"
        finally:
            greeted = len(greetings) == expected and all([_succeeded(g) for g in greetings])
            channel.close()
            await main.stop()
        try:
            async with asyncio.timeout(2.0):
                (out_head, out_trunc), (err_head, err_trunc) = await readers
        except TimeoutError:  # an escaped descendant still holds a pipe: give up on its output
            readers.cancel()
            out_head = err_head = b""
            out_trunc = err_trunc = True
        if not greeted:
            why = err_head.decode(errors="replace").strip()
            if not why and isinstance(main, Forked):
                why = await _head(main.forker.drain)
            why = (why or f"exit code {main.returncode}")[-300:]
            raise SandboxUnavailable(
                f"the sandbox did not start ({error}): {why}", timed_out=status in ("timeout", "starved")
            )
        if status == "starved":
            raise SandboxStarved(error)
        if status == "crashed":
            broken = next((p for p in [main, *others] if p.returncode not in (None, 0)), main)
            rc = broken.returncode or 0
            why = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
            error = f"{error} ({why})"
        verdicts += [{"ok": False, "error": f"not checked: {status}"}] * (len(tests.cases) - len(verdicts))
        result = RunResult(
            status=status,
            passed=sum(1 for v in verdicts if v["ok"]) if status == "ok" else 0,
            unverifiable=unverifiable[0] if unverifiable and status == "ok" else "",
            total=len(tests.cases),
            cases=verdicts[:MAX_CASES_REPORTED],
            error=error,
            exit_code=main.returncode,
            stdout=out_head.decode(errors="replace"),
            stderr=err_head.decode(errors="replace"),
            output_truncated=out_trunc or err_trunc,
            cpu_wait_credit_s=credit.waited_s,
        )
        return result, healthy

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process, *, keeper: bool) -> None:
        """End the run. With a keeper (`process` mode as root), SIGTERM asks it to SIGKILL every
        descendant, daemons included, before it exits. Then SIGKILL to the process group; in
        `namespaces` mode that kills unshare, whose death kills the pid namespace."""
        if keeper and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()


@functools.lru_cache(maxsize=64)
def _limits_fields(limits: SandboxLimits) -> dict[str, Any]:
    """`limits` as a sandboxed process is told them (one dict per limits: never changed)."""
    return asdict(limits)


def _succeeded(task: asyncio.Future[Any]) -> bool:
    """Whether `task` finished with a result; cancels it when it has not finished."""
    if not task.done():
        task.cancel()
        return False
    return not task.cancelled() and task.exception() is None


def _missing_isolation(why: str) -> str:
    return (
        f"no OS-level isolation for untrusted code: namespaces are unavailable ({why}). The code "
        "environment needs Linux with unshare(1), mount(8) and chroot(8), and either root with "
        "CAP_SYS_ADMIN (in a container: cap_add SYS_ADMIN and security_opt apparmor=unconfined, as "
        "deploy/docker-compose.yml gives the verifier) or a user allowed unprivileged user namespaces. "
        f"To run untrusted code anyway under Python-level guards only (UNSAFE), set {UNSAFE_OPT_IN}=1"
    )


def _service_python() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _world_usable(path: str) -> bool:
    """Every directory on the way is o+x and the file o+rx: the sandbox user can run it."""
    real = Path(os.path.realpath(path))
    dirs_ok = all(p.stat().st_mode & 0o001 for p in real.parents)
    return dirs_ok and real.is_file() and real.stat().st_mode & 0o005 == 0o005


def _world_usable_python() -> str | None:
    """An interpreter for `process` mode runs as the run's uid: the service's own when that user can
    reach it and its standard library, else the system's python3 (the runner needs only the
    standard library), else None (the code then runs as the service's user)."""
    own = _service_python()
    candidates = [own] if _world_usable(sys.base_prefix + "/lib") else []
    candidates += [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)]
    return next((c for c in candidates if _world_usable(c)), None)


async def _judge(
    channels: list[Channel],
    load: dict[str, Any],
    tests: TestSpec,
    verdicts: list[dict[str, Any]],
    unverifiable: list[str],
) -> tuple[str, bool]:
    """Given the solution's reply to "load", judge every case; returns the load error ("" when it
    loaded), and whether the clean interpreter's child ended with its last case (else it is sent
    "exit"). Assert cases are run by the clean interpreter (`channels[1]`), through a `Relay`."""
    if "error" in load:
        failed = {"ok": False, "error": f"the code did not load: {str(load['error'])[:MAX_ERROR_CHARS]}"}
        verdicts += [failed] * len(tests.cases)
        return str(load["error"])[:MAX_ERROR_CHARS], False
    if tests.kind == "asserts":
        relay = Relay(channels[1], channels[0])
        await relay.setup(load.get("names"), names_used(tests.cases))
        for i, case in enumerate(tests.cases):
            verdict = await relay.case(str(case), last=i == len(tests.cases) - 1)
            if verdict["unverifiable"]:
                unverifiable.append(verdict["unverifiable"][:MAX_ERROR_CHARS])
            if verdict["ok"]:
                verdicts.append({"ok": True})
            else:
                verdicts.append({"ok": False, "error": verdict["error"][:MAX_ERROR_CHARS]})
        await relay.settle()
        return "", relay.ended
    for case in tests.cases:
        try:
            await _check_io(channels[0], case)
            verdicts.append({"ok": True})
        except CaseFailed as exc:
            verdicts.append({"ok": False, "error": str(exc)[:MAX_ERROR_CHARS]})
    return "", False


async def _check_io(channel: Channel, case: dict[str, Any]) -> None:
    reply = await channel.request("main", stdin=str(case["input"]))
    if "error" in reply:
        raise CaseFailed(str(reply["error"]))
    stdout, exit_code, truncated = reply.get("stdout"), reply.get("exit", None), reply.get("truncated")
    if (
        type(stdout) is not str
        or type(truncated) is not bool
        or not (exit_code is None or type(exit_code) is int)
    ):
        raise ChannelBroken("malformed reply to main")
    if exit_code not in (None, 0):
        raise CaseFailed(f"SystemExit: {exit_code}")
    if truncated:
        raise CaseFailed("output exceeds the cap")
    if normalize_output(stdout) != normalize_output(str(case["output"])):
        raise CaseFailed(f"wrong output: {stdout[:MAX_ERROR_CHARS]!r}")


@dataclass
class Channel:
    """Requests as JSON lines on the sandbox's stdin; replies as length-prefixed JSON frames on a
    pipe of their own (`reply_fd` there). Implements `checks.Child`."""

    _writer: asyncio.StreamWriter
    _reader: asyncio.StreamReader
    _transport: asyncio.BaseTransport
    _max_frame: int
    _next_id: int = 0

    @classmethod
    async def open(cls, requests: asyncio.StreamWriter, reply_fd: int, *, max_frame: int) -> Channel:
        reader = asyncio.StreamReader(limit=max_frame + 8)
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(reply_fd, "rb", buffering=0)
        )
        return cls(requests, reader, transport, max_frame)

    def close(self) -> None:
        self._transport.close()
        with contextlib.suppress(Exception):
            self._writer.close()

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        return await self.receive(await self.send(op, **fields))

    async def send(self, op: str, **fields: Any) -> int:
        """Write one request (replies come back in order: `receive` them by id)."""
        ident = self._next_id
        self._next_id += 1
        try:
            self._writer.write((json.dumps({"id": ident, "op": op, **fields}) + "\n").encode())
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise ChannelBroken("the sandbox closed the channel") from None
        return ident

    async def receive(self, ident: int) -> dict[str, Any]:
        try:
            size = int.from_bytes(await self._reader.readexactly(4), "big")
            if size > self._max_frame:
                raise ChannelBroken(f"a reply of {size} bytes exceeds the {self._max_frame}-byte cap")
            frame = parse_frame(await self._reader.readexactly(size))
        except asyncio.IncompleteReadError:
            raise ChannelBroken("the sandbox closed the channel") from None
        except BadValue as exc:
            raise ChannelBroken(str(exc)) from None
        if frame["id"] != ident:
            raise ChannelBroken(f"reply {frame['id']} out of order (expected {ident})")
        return frame


async def _head(drain: asyncio.Future[Any]) -> str:
    """What a pre-started process wrote to stderr (`drain`: its output read to EOF), given a second."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(1.0):
            await asyncio.wait({drain})
    if not drain.done() or drain.cancelled() or drain.exception() is not None:
        return ""
    return str(drain.result()[1][0].decode(errors="replace").strip())


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _kill_groups(groups: set[int]) -> None:
    for group in list(groups):
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)


@dataclass(frozen=True)
class _Proc:
    """A started sandboxed process: its reply pipe (ours to read; its number there) and the uid its
    runner drops to (`process` mode as root)."""

    proc: asyncio.subprocess.Process
    reply_fd: int
    child_fd: int
    drop_to: int | None


@dataclass
class _Spawned:
    """The solution's process of one run, started in a sandbox of its own (`Sandbox._process`); the
    interface `forker.Forked` has too."""

    proc: asyncio.subprocess.Process
    reply_fd: int
    child_fd: int
    drop_to: int | None
    keeper: bool

    @property
    def stdin(self) -> asyncio.StreamWriter:
        assert self.proc.stdin is not None
        return self.proc.stdin

    @property
    def stdout(self) -> asyncio.StreamReader | None:
        return self.proc.stdout

    @property
    def stderr(self) -> asyncio.StreamReader | None:
        return self.proc.stderr

    @property
    def clock(self) -> tuple[int, int]:
        """What `clock` counts: the session it leads, and every descendant."""
        return self.proc.pid, 0

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self) -> int:
        return await self.proc.wait()

    async def stop(self) -> None:
        await Sandbox._stop(self.proc, keeper=self.keeper)


@dataclass
class _Zygote:
    """A pre-started clean interpreter (`_sandbox_runner.fork_server`): a sandbox of its own, with a
    uid of its own for its life, that forks one child per run. `uid` is None when it is not leased
    (the probe's): it is then never kept."""

    proc: _Proc
    channel: Channel
    stack: contextlib.AsyncExitStack
    uid: int | None
    drain: asyncio.Future[Any]
    mode: str
    loop: asyncio.AbstractEventLoop
    greeted: bool = False

    async def fork(self, limits: SandboxLimits, guards: bool) -> None:
        """Greet it the first time, then fork the run's child (its reply says the child is up)."""
        if not self.greeted:
            hello = await self.channel.send(
                "hello",
                reply_fd=self.proc.child_fd,
                limits=_limits_fields(limits),
                guards=guards,
                drop_to=self.proc.drop_to,
            )
            await self.channel.receive(hello)
            self.greeted = True
        reply = await self.channel.receive(
            await self.channel.send("fork", limits=_limits_fields(limits), guards=guards)
        )
        if "error" in reply:
            raise ChannelBroken(f"the clean interpreter did not fork: {reply['error']}")
