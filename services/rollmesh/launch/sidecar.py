"""A sidecar: a server process in another interpreter or virtualenv that a service starts, watches
and stops (a NeMo Gym resources server for the verifier; any foreign library's server later).

Contract:
- Start: `argv` runs with `env` + ROLLMESH_SIDECAR_PORT (0 the first time: the child binds an
  ephemeral loopback port) and ROLLMESH_PORT_FILE; the child writes `host:port` there once it
  listens. Ready = that file exists and `probe(address)` answers True. A child that exits, or is
  not ready within `start_timeout_s`, fails `start()` with `SidecarStartFailed`: one line naming
  the sidecar, its interpreter (argv[0]), how it ended, the last line of its log and the log's path.
- Logs: the child's stdout and stderr are appended to `log_path` (never to our stderr).
- Supervision: a child that dies is logged and restarted per the RestartPolicy (launch/restart.py:
  backoff, a budget within a window) on the port it had, so its address stays valid; the group is
  killed first (no orphaned grandchildren). While it is down the sidecar is BROKEN (`state`,
  `problem`); once the budget is spent it stays BROKEN. `ready(timeout_s)` waits until it serves and
  answers its probe; `restarts` counts its incarnations after the first.
- Stop: SIGTERM, SIGKILL of the whole group after `grace_s`; the child also gets SIGTERM from the
  kernel when this process dies (mesh/children.py), so no sidecar outlives its service.
- Confinement (`confine`): the child runs through mesh/confine.py. As root it gets a uid of its own,
  leased for the sidecar's life (its restarts included), read-only mounts with fresh /tmp, only its
  interpreter, its virtualenv, its script and `readable` to read past folders closed to other users
  (/root), a folder of its own (`<port_file>.run/`, its HOME, where it writes the port file, which
  is then copied to `port_file`) to write, its own pid namespace (pid 2 there under a minimal init,
  everything it starts dies with it; a keeper outside passes SIGTERM on) and `rlimits`; elsewhere it
  runs as this user under `rlimits`. What held is in `isolation` ("uid+mount+pid" or "limits";
  "none" when not confined; "" before it served) and the `sidecar_serving` log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from rollmesh.launch.errors import SidecarStartFailed
from rollmesh.launch.restart import RestartBudget
from rollmesh.launch.restart import RestartPolicy
from rollmesh.launch.restart import describe_exit
from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.children import kill_group
from rollmesh.mesh.confine import Confinement
from rollmesh.mesh.confine import UidLeases
from rollmesh.mesh.confine import command
from rollmesh.mesh.confine import program_paths
from rollmesh.mesh.confine import read_mode
from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.launch.sidecar")

Probe = Callable[[str], Awaitable[bool]]
LOG_TAIL_BYTES = 4096
# A confined server's limits: no core dumps, files up to 4 GiB, room for a server's sockets.
SIDECAR_RLIMITS = {"RLIMIT_CORE": 0, "RLIMIT_FSIZE": 4 << 30, "RLIMIT_NOFILE": 65536}


class State(enum.Enum):
    STARTING = "STARTING"
    SERVING = "SERVING"
    BROKEN = "BROKEN"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class SidecarSpec:
    name: str
    argv: tuple[str, ...]
    log_path: Path
    port_file: Path
    probe: Probe
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    start_timeout_s: float = 120.0
    grace_s: float = 5.0
    #: Run confined (module doc), `readable` besides its interpreter and script, under `rlimits`.
    confine: bool = False
    readable: Sequence[str] = ()
    rlimits: Mapping[str, int] = field(default_factory=lambda: dict(SIDECAR_RLIMITS))


def log_tail(path: Path) -> str:
    """The last non-empty line of a log ("" when none), for one-line errors."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - LOG_TAIL_BYTES, 0))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines()]
    except OSError:
        return ""
    return next((ln for ln in reversed(lines) if ln), "")[:300]


def _read_address(path: Path) -> str:
    """The port file's text ("" while there is none), never through a link (a confined child owns
    its folder)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"<unreadable: {exc.strerror}>"
    with os.fdopen(fd, "rb") as f:
        return f.read(256).decode("utf-8", "replace").strip()


class Sidecar:
    """One supervised server process: `await start()`, then use `address`; always `await stop()`."""

    def __init__(self, spec: SidecarSpec) -> None:
        self.spec = spec
        self.state = State.STOPPED
        self.problem = ""
        self.address = ""
        self.restarts = 0
        #: The server's lives so far, counted the moment one is seen to end, before the next starts:
        #: state a client kept from one life (a session) never passes for the next's, even while the
        #: new process already answers and `restarts` has not counted it yet.
        self.incarnation = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._port = 0
        self._budget = RestartBudget(spec.restart)
        self._serving = asyncio.Event()
        self._tasks = TaskSet()
        self._stopping = False
        self.isolation = ""
        self._uids = UidLeases()
        self._uid: int | None = None
        self._leased = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def describe(self) -> str:
        return f"{self.spec.name} (interpreter {self.spec.argv[0]})"

    async def start(self) -> None:
        """Start the child and wait until it serves; raises SidecarStartFailed (the child killed)."""
        self.state = State.STARTING
        if self.spec.confine and not self._leased:
            self._uid, self._leased = await self._uids.lease(), True
        try:
            await self._spawn_ready()
        except SidecarStartFailed as exc:
            self.state, self.problem = State.BROKEN, exc.message
            raise
        self._tasks.spawn(self._keep(), name=f"sidecar-{self.spec.name}")

    @property
    def _run_dir(self) -> Path:
        return self.spec.port_file.with_suffix(".run")

    def _prepare(self) -> tuple[Path, list[str]]:
        """The port file the child writes and its command line (blocking: run off the loop)."""
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        spec.port_file.unlink(missing_ok=True)
        if not spec.confine:  # the wrapper only for the parent's death signal: never a preexec_fn
            return spec.port_file, command(spec.argv, Confinement(), spec.port_file.with_suffix(".mode"))
        run = self._run_dir
        run.mkdir(mode=0o700, exist_ok=True)
        if self._uid is not None:
            os.chown(run, self._uid, self._uid)
        port_file = run / "addr"
        port_file.unlink(missing_ok=True)
        confinement = Confinement(
            rlimits=spec.rlimits,
            uid=self._uid,
            readable=[*program_paths(spec.argv, spec.env.get("PATH")), *spec.readable],
            writable=[str(run)],
        )
        return port_file, command(spec.argv, confinement, spec.port_file.with_suffix(".mode"))

    async def _spawn_ready(self) -> None:
        spec = self.spec
        port_file, argv = await asyncio.to_thread(self._prepare)
        env = {
            **spec.env,
            "ROLLMESH_SIDECAR_PORT": str(self._port),
            "ROLLMESH_PORT_FILE": str(port_file),
        }
        if spec.confine:
            env["HOME"] = str(self._run_dir)
            env.pop("TMPDIR", None)  # its /tmp is its own
        with spec.log_path.open("ab") as logf:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=logf,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    cwd=spec.cwd,
                    # No preexec_fn: Python then forks (not vfork) and runs the fork handlers in the
                    # child, gRPC's included, which aborted a server before exec ("epoll_wait error:
                    # Bad file descriptor") in a process that had used gRPC. The wrapper asks for
                    # the parent's death signal instead (mesh/_confine.py).
                    start_new_session=True,
                )
            except OSError as exc:
                raise self._failed(f"could not be started: {exc}") from None
        proc = self._proc
        try:
            async with asyncio.timeout(spec.start_timeout_s):
                # Until it has written something: a server that opens the file and then writes
                # was seen between the two ("wrote '' to its port file").
                while not (bound := await asyncio.to_thread(_read_address, port_file)):
                    if proc.returncode is not None:
                        raise self._failed(f"{describe_exit(proc.returncode)} before serving")
                    await asyncio.sleep(0.05)
                host, _, port = bound.rpartition(":")
                if not port.isdigit():
                    raise self._failed(f"wrote {bound[:60]!r} to its port file, not host:port")
                self._port = int(port)
                if port_file != spec.port_file:  # the address where it always is, for people and tools
                    await asyncio.to_thread(spec.port_file.write_text, f"{host}:{port}")
                self.address = f"{'127.0.0.1' if host in ('', '0.0.0.0') else host}:{port}"
                while not await spec.probe(self.address):
                    if proc.returncode is not None:
                        raise self._failed(f"{describe_exit(proc.returncode)} before serving")
                    await asyncio.sleep(0.05)
        except TimeoutError:
            kill_group(proc)
            await proc.wait()
            raise self._failed(f"did not serve within {spec.start_timeout_s:g}s") from None
        except BaseException:
            kill_group(proc)
            raise
        self.isolation = "none"
        if spec.confine:
            self.isolation = await asyncio.to_thread(read_mode, spec.port_file.with_suffix(".mode"))
        self.state, self.problem = State.SERVING, ""
        self._serving.set()
        log.info(
            "sidecar_serving",
            name=spec.name,
            address=self.address,
            pid=proc.pid,
            isolation=self.isolation,
        )

    def _failed(self, how: str) -> SidecarStartFailed:
        tail = log_tail(self.spec.log_path)
        last = f"; last log line: {tail}" if tail else ""
        if self._uid is not None and ("ModuleNotFoundError" in tail or "No such file" in tail):
            last += (
                "; it ran confined (its own uid and mounts): it reads only its interpreter, its virtualenv"
                " and the folders that virtualenv's .pth files name, its environment folder and what"
                " the bridge adds (docs/security.md); a package elsewhere is not visible to it"
            )
        return SidecarStartFailed(
            f"{self.describe()} {how}{last}; log: {self.spec.log_path}",
            metadata={"sidecar": self.spec.name, "log": str(self.spec.log_path)},
        )

    async def _keep(self) -> None:
        """Restart the child whenever it dies, until stopped or the policy gives up (then BROKEN)."""
        loop = asyncio.get_running_loop()
        policy = self.spec.restart
        while True:
            proc = self._proc
            assert proc is not None
            code = await proc.wait()
            kill_group(proc)
            if self._stopping:
                return
            self.incarnation += 1
            self._serving.clear()
            self.state = State.BROKEN
            self.problem = (
                f"{self.describe()} (pid {proc.pid}) {describe_exit(code)}; log: {self.spec.log_path}"
            )
            log.warning("sidecar_died", name=self.spec.name, pid=proc.pid, exit=describe_exit(code))
            delay = self._budget.next_delay(loop.time()) if policy.wants_restart(code) else None
            if delay is None:
                self.problem += (
                    f"; not restarted (restart policy {policy.mode!r}, {self._budget.used} restarts)"
                )
                log.error("sidecar_given_up", name=self.spec.name, problem=self.problem)
                return
            await asyncio.sleep(delay)
            try:
                await self._spawn_ready()
                self.restarts += 1
            except SidecarStartFailed as exc:
                self.problem = exc.message
                log.warning("sidecar_restart_failed", name=self.spec.name, error=exc.message)
                if self._proc is not None and self._proc.returncode is None:
                    kill_group(self._proc)

    async def ready(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the sidecar to serve and answer its probe; True when it does.
        (A caller that found it unreachable may ask before the supervisor has seen it die: the probe,
        not the state alone, says it is back.)"""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if self.state is State.SERVING and await self.spec.probe(self.address):
                return True
            left = deadline - loop.time()
            if left <= 0 or self._stopping:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.2)):
                    await self._serving.wait()
                    await asyncio.sleep(0.05)  # served, but its probe failed: not too eager

    async def stop(self) -> None:
        """SIGTERM; SIGKILL the group after `grace_s`. Safe to call more than once."""
        self._stopping = True
        self._serving.clear()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.spec.grace_s):
                    await proc.wait()
        if proc is not None:
            kill_group(proc)
            await proc.wait()
        await self._tasks.aclose()
        self.state = State.STOPPED
        if self._leased:
            self._uids.release(self._uid)
            self._uid, self._leased = None, False
