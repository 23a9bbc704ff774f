"""Agent servers: one long-running agent program serving every rollout of a job run (NeMo Gym's agent
server shape), instead of a process per rollout (program.py's `PerRollout`).

The server starts at the job's first rollout, confined as a per-rollout program is (mesh/confine.py:
as root a uid of its own, leased for the server's life, read-only mounts but its folder, pid 1 of
its own namespace; a network namespace whose loopback serves the capture's and the tools' ports,
relayed here), with only these variables (plus PATH, LANG and the job's `program_env`):

    ROLLMESH_AGENT_PORT   the port it serves HTTP on, 127.0.0.1 (relayed to a Unix socket here
                          when it has a network namespace of its own)
    ROLLMESH_MODEL        the job's model name
    HOME, TMPDIR          its folder (removed when it stops)

and is up when that port answers HTTP (any status). Per rollout it gets one request,

    POST /run  {"messages", "tools", "task", "max_steps", "tools_url",     (the task document a
                "base_url", "api_key", "model"}                             per-rollout program gets)

and answers 200, with `{"answer": "..."}` when it has an answer to verify besides its last model
call (an empty body is no answer). `base_url`/`api_key` are the rollout's capture: every model call
made through them is recorded into that rollout's token record exactly as a per-rollout program's
are (program.py runs the rest: sessions, capture, verify). A rollout's request:

- answered 200: the rollout is verified (program.py's `_outcome`);
- answered another status, or a body that is not such an object: AGENT_SERVER_FAILED (the row's
  own failure, not retried), the status and the body's start in the message;
- past the program deadline: the request is dropped, AGENT_PROGRAM_TIMEOUT (retried), the server
  keeps serving;
- the server died meanwhile: AGENT_SERVER_DIED (retried), its exit status and last stderr line in
  the message; the next rollout starts it again. After MAX_QUICK_DEATHS deaths (or failed starts)
  in a row without one rollout served, it is not started again: every rollout after is
  AGENT_PROGRAM_UNSTARTABLE with the last reason.

Its stdout and stderr are drained all along; the last `output_limit` bytes of each are kept for
those messages. Requests of many rollouts run at once in the one server: nothing keeps one
rollout's request from seeing what another's left in the server's memory or folder (per-rollout
modes do; docs/external-agents.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
import time
from collections import deque
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.children import kill_group
from rollmesh.mesh.confine import LIMITS_MODE
from rollmesh.mesh.confine import UidLeases
from rollmesh.mesh.confine import read_mode
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler.drivers.program import HostRun
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.program import RolloutIO
from rollmesh.scheduler.drivers.program import loopback_relays
from rollmesh.scheduler.drivers.program import prepare_folder
from rollmesh.scheduler.drivers.program import start_confined
from rollmesh.scheduler.errors import AgentProgramUnstartable
from rollmesh.scheduler.errors import AgentServerDied
from rollmesh.scheduler.errors import AgentServerFailed

log = get_logger("rollmesh.scheduler.agent_server")

MAX_QUICK_DEATHS = 3
_POLL_S = (0.02, 0.1)  # readiness polling: first and longest wait between tries (a late
# poll is time every rollout waiting for the server loses; a poll costs a refused connect)
_DEATH_GRACE_S = 2.0  # after a dropped request, how long to wait to learn whether the server died


class _Output:
    """The tail of one stream of the server (its last `limit` bytes)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: deque[bytes] = deque()
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        while self.size - len(self.chunks[0]) >= self.limit:
            self.size -= len(self.chunks.popleft())

    def text(self) -> str:
        return b"".join(self.chunks)[-self.limit :].decode(errors="replace")

    def last_line(self) -> str:
        lines = self.text().strip().splitlines()
        return lines[-1][:300] if lines else ""


class _Server:
    """One start of the server process: its folder, its address here, its output, its end."""

    def __init__(
        self, proc: asyncio.subprocess.Process, base: Path, limit: int, ports: set[int] | None
    ) -> None:
        self.proc = proc
        self.base = base
        self.ports = ports
        self.url = ""
        self.stdout, self.stderr = _Output(limit), _Output(limit)
        self.sandbox = LIMITS_MODE
        self.session: aiohttp.ClientSession | None = None
        self.drains = [
            asyncio.ensure_future(_drain(proc.stdout, self.stdout)),
            asyncio.ensure_future(_drain(proc.stderr, self.stderr)),
        ]

    def exited(self) -> int | None:
        return self.proc.returncode

    def why(self) -> str:
        code = self.proc.returncode
        status = f"exit {code}" if code is None or code >= 0 else f"killed by signal {-code}"
        tail = self.stderr.last_line()
        return status + (f": {tail}" if tail else "")

    async def close(self) -> None:
        kill_group(self.proc)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.gather(*self.drains, return_exceptions=True), 5.0)
        if self.session is not None:
            await self.session.close()
        await asyncio.to_thread(shutil.rmtree, self.base, True)


async def _drain(stream: asyncio.StreamReader | None, into: _Output) -> None:
    if stream is None:
        return
    while chunk := await stream.read(1 << 16):
        into.add(chunk)


class AgentServer:
    """The job's agent server (module doc): started at the first `run`, again after it died."""

    def __init__(self, uids: UidLeases | None = None) -> None:
        self.uids = uids or UidLeases()
        self.starts = 0
        self._server: _Server | None = None
        self._uid: int | None = None
        self._leased = False
        self._lock = asyncio.Lock()
        self._quick_deaths = 0
        self._broken = ""
        self._relays: contextlib.AsyncExitStack | None = None

    async def run(self, program: ProgramSpec, rollout: RolloutIO) -> HostRun:
        server = await self._ready(program, rollout)
        assert server.session is not None
        body = {
            **rollout.task_doc,
            "base_url": rollout.base_url,
            "api_key": rollout.token,
            "model": rollout.model,
        }
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(program.timeout_s):
                async with server.session.post(server.url + "/run", json=body) as answer:
                    status = answer.status
                    text = await answer.content.read(program.output_limit + 1)
        except TimeoutError:  # (the program's timeout class: program.py `_check_run`)
            return HostRun(
                seconds=time.monotonic() - t0, timed_out=True, sandbox=server.sandbox, mode="server"
            )
        except aiohttp.ClientError as exc:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(server.proc.wait()), _DEATH_GRACE_S)
            if server.exited() is not None:
                raise AgentServerDied(f"the agent server died during the rollout ({server.why()})") from None
            raise AgentServerFailed(f"the agent server dropped the rollout's /run request: {exc}") from None
        run = HostRun(
            exit_code=0,
            stdout=text[: program.output_limit],
            stdout_cut=len(text) > program.output_limit,
            seconds=time.monotonic() - t0,
            sandbox=server.sandbox,
            mode="server",
        )
        run.answer = _answer(status, text)
        self._quick_deaths = 0
        return run

    async def stop(self) -> None:
        async with self._lock:
            await self._close()
            if self._leased:
                self.uids.release(self._uid)
                self._leased = False

    async def _ready(self, program: ProgramSpec, rollout: RolloutIO) -> _Server:
        ports = _ports(rollout)
        server = self._server
        if server is not None and server.exited() is None and server.ports == ports:
            return server
        async with self._lock:
            server = self._server
            if server is not None and server.exited() is None and server.ports == ports:
                return server
            if server is not None:
                if server.exited() is not None:
                    self._quick_deaths += 1
                    log.warning("agent_server_died", why=server.why(), deaths_in_a_row=self._quick_deaths)
                    self._broken_if_looping(server.why())
                await self._close()
            if self._broken:
                raise AgentProgramUnstartable(self._broken)
            try:
                self._server = await self._start(program, rollout, ports)
            except AgentServerDied as exc:
                self._quick_deaths += 1
                self._broken_if_looping(exc.message)
                raise
            return self._server

    def _broken_if_looping(self, why: str) -> None:
        if self._quick_deaths >= MAX_QUICK_DEATHS:
            self._broken = (
                f"the agent server died or failed to start {self._quick_deaths} times in a row "
                f"without serving a rollout; last: {why}"
            )

    async def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.close()
        if self._relays is not None:
            await self._relays.aclose()
            self._relays = None

    async def _start(self, program: ProgramSpec, rollout: RolloutIO, ports: set[int] | None) -> _Server:
        if not self._leased:
            self._uid = await self.uids.lease()
            self._leased = True
        base = Path(tempfile.mkdtemp(prefix="rollmesh-agent-server-"))
        work = base / "work"
        await asyncio.to_thread(prepare_folder, base, work, self._uid)
        port = await asyncio.to_thread(_free_port)
        exposed = base / "server.sock"
        self._relays = contextlib.AsyncExitStack()
        forward = await self._relays.enter_async_context(
            loopback_relays(base, [rollout.base_url, rollout.tools_url])
        )
        variables = {"ROLLMESH_AGENT_PORT": str(port), "ROLLMESH_MODEL": rollout.model}
        expose = [[port, str(exposed)]] if forward is not None else []
        mode_file = base / "sandbox"
        self.starts += 1
        try:
            proc = await start_confined(
                program, work, variables, mode_file, forward=forward, uid=self._uid, expose=expose
            )
        except AgentProgramUnstartable:
            await asyncio.to_thread(shutil.rmtree, base, True)
            raise
        server = _Server(proc, base, program.output_limit, ports)
        try:
            await self._wait_up(server, program, port, exposed, mode_file)
        except BaseException:
            await server.close()
            raise
        log.info("agent_server_up", sandbox=server.sandbox, starts=self.starts, argv0=program.argv[0])
        return server

    async def _wait_up(
        self, server: _Server, program: ProgramSpec, port: int, exposed: Path, mode_file: Path
    ) -> None:
        """Until its port answers HTTP; AGENT_SERVER_DIED when it exits first or stays silent past
        the program deadline."""
        deadline = time.monotonic() + program.timeout_s
        wait = _POLL_S[0]
        while server.session is None:  # the mode file is written before the program starts
            if server.exited() is not None:
                raise AgentServerDied(f"the agent server exited before it was up ({server.why()})")
            held = await asyncio.to_thread(_mode_written, mode_file)
            if held is not None:
                server.sandbox = held
                connector: aiohttp.BaseConnector = (
                    aiohttp.UnixConnector(path=str(exposed), limit=0)
                    if "network" in held
                    else aiohttp.TCPConnector(limit=0)
                )
                server.session = aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(None)
                )
            else:
                await asyncio.sleep(wait)
        server.url = "http://agent-server" if "network" in server.sandbox else f"http://127.0.0.1:{port}"
        while True:
            if server.exited() is not None:
                raise AgentServerDied(f"the agent server exited before it was up ({server.why()})")
            if time.monotonic() > deadline:
                raise AgentServerDied(
                    f"the agent server did not answer HTTP on its port within {program.timeout_s:g} s"
                    + (f" (stderr: {server.stderr.last_line()})" if server.stderr.last_line() else "")
                )
            try:
                async with asyncio.timeout(max(1.0, wait)):
                    async with server.session.get(server.url + "/") as answer:
                        await answer.read()
                return
            except (aiohttp.ClientError, TimeoutError, OSError):
                await asyncio.sleep(wait)
                wait = min(wait * 2, _POLL_S[1])


def _answer(status: int, text: bytes) -> str | None:
    """The answer in a /run reply (None: none); AGENT_SERVER_FAILED for an error or a bad body."""
    start = text[:300].decode(errors="replace")
    if status != 200:
        raise AgentServerFailed(f"the agent server answered {status} to the rollout's /run: {start}")
    if not text.strip():
        return None
    try:
        body = untrusted_json.loads(text)
    except ValueError:
        raise AgentServerFailed(f"the agent server's /run reply is not JSON: {start}") from None
    if not isinstance(body, dict):
        raise AgentServerFailed(f"the agent server's /run reply is not an object: {start}")
    answer = body.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise AgentServerFailed(f'the agent server\'s "answer" is a {type(answer).__name__}, not a string')
    return answer


def _ports(rollout: RolloutIO) -> set[int] | None:
    """The loopback ports the server's network must reach (None: a URL is elsewhere)."""
    ports: set[int] = set()
    for url in filter(None, [rollout.base_url, rollout.tools_url]):
        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
            return None
        ports.add(parts.port)
    return ports


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mode_written(path: Path) -> str | None:
    try:
        if not path.read_text().strip():
            return None
    except FileNotFoundError:
        return None
    return read_mode(path)
