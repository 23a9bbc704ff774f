"""External agent programs: the second driver of a rollout, next to the built-in loop (agent.py).

A job that names a program (`AgentSpec.program`, argv) runs it once per rollout attempt instead of
`run_agent`, and produces the same `AgentOutcome`:

1. seed the environment session (as the built-in loop does; an environment that takes turns is
   AGENT_PROGRAM_UNSUPPORTED: a program has no way to hand it turns);
2. open a capture on the gateway (gateway/captures.py): an OpenAI base URL and token of the rollout's
   own, on the job's model with the job's sampling (the rollout's seed included) and the rollout's
   session id; open the environment's tools on the job's tool endpoint (tool_endpoint.py);
3. run the program (`ProgramSpec`) in a fresh folder with only these variables (plus PATH, LANG and
   the job's `program_env`; never ROLLMESH_API_KEY):
       OPENAI_BASE_URL, OPENAI_API_KEY   the capture (every call through it is recorded)
       ROLLMESH_TASK_FILE                the task (also on stdin): {"messages", "tools", "task",
                                         "max_steps", "tools_url", "answer_file"}; "task" is
                                         `public_task`: the prompt and the fields the environment
                                         marks public, never the gold (the dataset file and the
                                         output folder are hidden too: `ProgramSpec.hidden`)
       ROLLMESH_TOOLS_URL                the environment's tools (GET lists, POST <url>/call runs one)
       ROLLMESH_ANSWER_FILE              where the program may write its answer
       ROLLMESH_MODEL                    the job's model name (the capture uses it whatever is sent)
   It runs confined (mesh/confine.py) as a session leader under rlimits (address space, file size,
   open files, core dumps) and is killed with its process group at `timeout_s`
   (AGENT_PROGRAM_TIMEOUT, retryable) or when the attempt is cancelled; while it runs the attempt's
   own deadline is held (retry.attempt_deadline_held), so overrunning is always that class. Its
   stdout and stderr are kept up to `output_limit` bytes each. The row's `sandbox` says what held:
   as root "uid+mount+pid+network" (a uid of its own, leased per run; read-only mounts where only
   its folder, its executable and its interpreter are there to read past closed folders; pid 2 under
   a minimal init in its own pid namespace, so its signals to itself work; a network namespace whose
   loopback serves only its capture's and tools' ports, served here through sockets handed over a
   Unix socket, by the port's own server when it runs in this process: `loopback_relays`),
   "network" where only a network namespace could be had, else "limits" (docs/external-agents.md);
4. close the capture: its calls, in order, are the rollout's turns. A call whose prompt ids do not
   extend the previous call's prompt + output starts a new segment of the token record (tokens.py);
5. exit non-zero or killed by a signal: AGENT_PROGRAM_EXITED, the message naming the signal or
   the exit code and the stderr line that says what went wrong (`_error_line`); no answered model
   call: AGENT_PROGRAM_NO_MODEL_CALL; a call
   aborted: GENERATION_ABORTED (retryable, as in the built-in loop); else verify the final
   transcript (the last call's conversation and its answer, after the row's input), with the answer
   file's text appended as an assistant message when the program wrote one.

The row's messages are each segment's transcript in order, a later segment's first message marked
`records.SEGMENT_KEY`; `AgentOutcome.program` (the row's `agent_program`) keeps the exit code, the
output, the counts of calls, refused calls, tool calls and segments, and whether an answer file
was used; a failure of a program that ran carries the same (errors.ProgramRun), which the
failures file keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Protocol
from urllib.parse import urlsplit

from rollmesh.mesh.aio import read_capped
from rollmesh.mesh.children import kill_group
from rollmesh.mesh.confine import LIMITS_MODE
from rollmesh.mesh.confine import Confinement
from rollmesh.mesh.confine import ShimUnresolved
from rollmesh.mesh.confine import UidLeases
from rollmesh.mesh.confine import command
from rollmesh.mesh.confine import program_paths
from rollmesh.mesh.confine import read_mode
from rollmesh.mesh.confine import resolve_shim
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.loopback import served_here
from rollmesh.scheduler.drivers.agent_loop import AgentOutcome
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import EnvPort
from rollmesh.scheduler.drivers.agent_loop import Json
from rollmesh.scheduler.drivers.agent_loop import ModelPort
from rollmesh.scheduler.drivers.agent_loop import SessionOpened
from rollmesh.scheduler.drivers.agent_loop import ToolResult
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.drivers.agent_loop import close_sessions
from rollmesh.scheduler.drivers.agent_loop import input_messages
from rollmesh.scheduler.drivers.agent_loop import merge_tools
from rollmesh.scheduler.drivers.agent_loop import row_sampling
from rollmesh.scheduler.drivers.agent_loop import row_tools
from rollmesh.scheduler.drivers.tool_endpoint import ToolEndpoint
from rollmesh.scheduler.errors import AgentProgramExited
from rollmesh.scheduler.errors import AgentProgramNoModelCall
from rollmesh.scheduler.errors import AgentProgramTimedOut
from rollmesh.scheduler.errors import AgentProgramUnstartable
from rollmesh.scheduler.errors import AgentProgramUnsupported
from rollmesh.scheduler.errors import GenerationAborted
from rollmesh.scheduler.errors import ProgramRun
from rollmesh.scheduler.records import SEGMENT_KEY
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.retry import attempt_deadline_held

log = get_logger("rollmesh.scheduler.drivers.program")

DEFAULT_OUTPUT_LIMIT = 64 * 1024
# The rlimits a program runs under (a coding agent's toolchain needs room; these stop runaways).
DEFAULT_RLIMITS = {
    "RLIMIT_AS": 8 << 30,
    "RLIMIT_FSIZE": 1 << 30,
    "RLIMIT_NOFILE": 4096,
    "RLIMIT_CORE": 0,
}
_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "SYSTEMROOT")


@dataclass(frozen=True)
class ProgramSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 300.0
    #: What the attempt keeps after the program ends (closing, verify): its deadline is held while
    #: the program runs and gives at least this much after (retry.attempt_deadline_held).
    after_s: float = 30.0
    #: Paths the program must not read (the job's dataset and output folder: they hold the gold),
    #: where its confinement can hide them (mesh/confine.py `Confinement.hidden`).
    hidden: tuple[str, ...] = ()
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    rlimits: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_RLIMITS))


@dataclass(frozen=True)
class CaptureOpened:
    base_url: str
    token: str


@dataclass
class CapturedTurn:
    """One recorded call: the conversation the program sent and the gateway's answer."""

    api: str
    messages: list[Json]
    turn: Turn
    requested_model: str = ""  # the `model` the call named (it ran on the capture's model)
    model: str = ""  # the model that answered


@dataclass
class CaptureRecord:
    calls: list[CapturedTurn] = field(default_factory=list)
    refused: int = 0


class CapturePort(Protocol):
    """The gateway's captures (remote.py: OpenCapture / CloseCapture)."""

    async def open_capture(
        self, capture_id: str, *, model: str, sampling: Json, session_id: str
    ) -> CaptureOpened: ...

    async def close_capture(self, capture_id: str) -> CaptureRecord: ...


class ProgramModel(ModelPort, CapturePort, Protocol):
    """A model port that can also open captures."""


@dataclass
class HostRun:
    """How the program ran for one rollout, as its host saw it (`ProgramHost.run`)."""

    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_cut: bool = False
    stderr_cut: bool = False
    seconds: float = 0.0
    timed_out: bool = False
    sandbox: str = LIMITS_MODE
    mode: str = "command"  # "command", "warm" or "server" (drivers/modes.py)
    answer: str | None = None  # the answer file's text (an agent server's "answer")


@dataclass(frozen=True)
class RolloutIO:
    """What a rollout gives its program: its capture (base URL, token), its tools' URL and the
    task document (module doc, step 3, without `answer_file`: a per-rollout host adds it)."""

    base_url: str
    token: str
    tools_url: str
    task_doc: Json
    model: str


class ProgramHost(Protocol):
    """Where a job's program runs: once per rollout (`PerRollout`: a command, or forked from a warm
    interpreter, drivers/warm.py) or as one agent server for the job (drivers/agent_server.py)."""

    async def run(self, program: ProgramSpec, rollout: RolloutIO) -> HostRun: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class RolloutProcess:
    """What one rollout's process of `PerRollout` gets: its folder (`base`: sockets and mode file;
    `work`: its own), its variables and stdin, its network's forwarded ports (None: no network
    namespace) and its uid (None: the scheduler's)."""

    base: Path
    work: Path
    variables: Mapping[str, str]
    stdin: bytes
    forward: list[list[Any]] | None = None
    uid: int | None = None


# Starts and runs one rollout's process (`_run`: a fresh process; drivers/warm.py: a fork).
Spawn = Callable[[ProgramSpec, RolloutProcess], Awaitable[HostRun]]


async def run_program(
    *,
    job_id: str,
    key: RolloutKey,
    task: Json,
    seed: int,
    settings: AgentSettings,
    program: ProgramSpec,
    model: ProgramModel,
    env: EnvPort,
    tools: ToolEndpoint,
    host: ProgramHost | None = None,
) -> AgentOutcome:
    """One attempt of one rollout driven by `program` on `host` (default: a fresh process,
    `PerRollout`); its sessions, capture and tool URL are always closed (module doc)."""
    session_id = f"{job_id}/{key.task_index}/{key.rollout_index}"
    own_tools = row_tools(task)
    env_session = not settings.stateless or bool(own_tools)
    seeded = captured = False
    tools_key = ""
    record = CaptureRecord()
    host = host or PerRollout()
    try:
        opened = SessionOpened()
        if env_session:
            opened = await env.seed_session(settings.environment, task, session_id)
            seeded = True
        if settings.group_verify:
            raise AgentProgramUnsupported(
                f"environment {settings.environment!r} scores a task's rollouts together "
                "(verify_group): an external agent program's rollouts are verified one by one; "
                "use the built-in loop"
            )
        if opened.takes_turns:
            raise AgentProgramUnsupported(
                f"environment {settings.environment!r} takes turns (Step): an external agent program "
                "cannot hand it assistant turns; use the built-in loop"
            )
        offered = merge_tools(merge_tools(opened.tools, opened.session_tools), own_tools)
        sampling = row_sampling(task, settings.sampling)
        sampling["seed"] = seed
        prompt = input_messages(task, settings.system_prompt)
        capture = await model.open_capture(
            session_id, model=settings.model, sampling=sampling, session_id=session_id
        )
        captured = True
        tools_url = ""
        if env_session:
            # The endpoint's server runs its handlers in its own context: each call runs in this
            # rollout's (its timing, timing.py, records the call).
            rollout_context = contextvars.copy_context()

            async def call_tool(call: Json) -> ToolResult:
                return await asyncio.create_task(env.call_tool(session_id, call), context=rollout_context)

            tools_url, tools_key = await tools.open(offered, call_tool)
        task_doc = {
            "messages": [*prompt, *opened.messages],
            "tools": [{"type": "function", "function": t} for t in offered],
            "task": public_task(task, settings.public_fields),
            "max_steps": settings.max_steps,
            "tools_url": tools_url,
        }
        rollout = RolloutIO(capture.base_url, capture.token, tools_url, task_doc, settings.model)
        with attempt_deadline_held(program.after_s):  # the program's deadline is the one
            run = await host.run(program, rollout)
        tool_calls = tools.close(tools_key) if tools_key else 0
        tools_key = ""
        record = await model.close_capture(session_id)
        captured = False
        answer = run.answer
        kept = {
            "mode": run.mode,
            "sandbox": run.sandbox,
            "exit_code": run.exit_code,
            "signal": _signal_name(run.exit_code),
            "seconds": round(run.seconds, 3),
            "stdout": run.stdout.decode(errors="replace"),
            "stderr": run.stderr.decode(errors="replace"),
            "stdout_truncated": run.stdout_cut,
            "stderr_truncated": run.stderr_cut,
            "calls": len(record.calls),
            "refused_calls": record.refused,
            "tool_calls": tool_calls,
            "segments": _mark_segments(record) if record.calls else 0,
            "answer_file": answer is not None,
            "answer": answer,
            "models": _models(record),
        }
        try:
            _check_run(run, record, program)
            outcome = await _outcome(
                record, prompt, settings, task, env, session_id if env_session else "", answer
            )
        except ProgramRun as exc:
            exc.agent_program = kept
            raise
        outcome.program = kept
        return outcome
    finally:
        if tools_key:
            tools.close(tools_key)
        if captured:
            with contextlib.suppress(Exception):
                await model.close_capture(session_id)
        await close_sessions(env if seeded else None, model, session_id)


class PerRollout:
    """A fresh process per rollout: a folder of its own (removed after), its uid leased from
    `uids` (as root; one `UidLeases` per job is enough), the task file and the loopback relays of
    its network; `spawn` starts it (`_run`: exec'd through mesh/confine.py; drivers/warm.py: forked
    from a warm interpreter, whose rollouts' folders must be under its `root`)."""

    def __init__(
        self,
        uids: UidLeases | None = None,
        spawn: Spawn | None = None,
        *,
        root: Path | None = None,
        mode: str = "command",
    ) -> None:
        self.uids = uids or UidLeases()
        self.spawn: Spawn = spawn or _run
        self.root = root
        self.mode = mode

    async def run(self, program: ProgramSpec, rollout: RolloutIO) -> HostRun:
        uid = await self.uids.lease()
        # The program's folder is base/work (its own when it has a uid); its sockets and the mode
        # file stay in base, out of its reach.
        base = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="rollmesh-agent-", dir=self.root))
        work = base / "work"
        try:
            await asyncio.to_thread(prepare_folder, base, work, uid)
            answer_file = work / "answer.txt"
            task_file = work / "task.json"
            task_doc = {**rollout.task_doc, "answer_file": str(answer_file)}
            task_bytes = json.dumps(task_doc, ensure_ascii=False).encode()
            await asyncio.to_thread(task_file.write_bytes, task_bytes)
            variables = {
                "OPENAI_BASE_URL": rollout.base_url,
                "OPENAI_API_KEY": rollout.token,
                "ROLLMESH_TASK_FILE": str(task_file),
                "ROLLMESH_TOOLS_URL": rollout.tools_url,
                "ROLLMESH_ANSWER_FILE": str(answer_file),
                "ROLLMESH_MODEL": rollout.model,
            }
            async with loopback_relays(base, [rollout.base_url, rollout.tools_url]) as forward:
                run = await self.spawn(
                    program, RolloutProcess(base, work, variables, task_bytes, forward, uid)
                )
            run.mode = self.mode
            run.answer = await asyncio.to_thread(_read_answer, answer_file)
            return run
        finally:
            await asyncio.to_thread(shutil.rmtree, base, True)
            self.uids.release(uid)

    async def stop(self) -> None:
        return None


def public_task(task: Json, public_fields: tuple[str, ...] = ()) -> Json:
    """What of a task row a program may read: its prompt (`responses_create_params`: input,
    instructions, tools, sampling) and the fields its environment marks public
    (`Environment.public_fields`); never the gold nor anything else the verifier scores against."""
    fields = ("responses_create_params", *public_fields)
    return {k: task[k] for k in fields if k in task}


def _models(record: CaptureRecord) -> list[Json]:
    """Per model name the program asked for (in order of first use): which model answered, in how
    many calls. A name the job does not serve runs on the job's model: the row says so."""
    seen: dict[tuple[str, str], Json] = {}
    for call in record.calls:
        entry = seen.setdefault(
            (call.requested_model, call.model),
            {"requested": call.requested_model, "answered": call.model, "calls": 0},
        )
        entry["calls"] += 1
    return list(seen.values())


def _signal_name(exit_code: int | None) -> str | None:
    """ "SIGABRT" for a process killed by signal 6 (a negative exit code), else None."""
    if exit_code is None or exit_code >= 0:
        return None
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


# A line naming an error (not "[non-fatal] ..." nor a warning's "errors=...").
_ERROR_WORDS = re.compile(r"(?<!non-)\b(error|exception|fatal|panic|abort(ed)?|killed)\b", re.IGNORECASE)


def _error_line(stderr: str) -> str:
    """The line of `stderr` that says what went wrong: the exception line of its last Python
    traceback, else the last line naming an error, else its last line ("" when it is empty). An
    SDK's chatter after the error (a tracing exporter's "[non-fatal] ...") is not it."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if starts:
        for line in lines[starts[-1] + 1 :]:
            if not line[:1].isspace():
                return line
    named = [line for line in lines if _ERROR_WORDS.search(line)]
    return (named or lines or [""])[-1]


def _check_run(run: HostRun, record: CaptureRecord, program: ProgramSpec) -> None:
    """The failure classes of how the program ended (module doc, step 5)."""
    argv0 = program.argv[0]
    if run.timed_out:
        raise AgentProgramTimedOut(
            f"the agent program ran past {program.timeout_s:g} s and was killed",
            metadata={"argv0": argv0},
        )
    stderr = run.stderr.decode(errors="replace")
    if run.exit_code == 127 and stderr.startswith("cannot run "):
        raise AgentProgramUnstartable(stderr.strip()[:300])
    if run.exit_code != 0:
        died = _signal_name(run.exit_code)
        how = f"was killed by {died}" if died else f"exited with {run.exit_code}"
        said = _error_line(stderr)
        raise AgentProgramExited(
            f"the agent program {how} after {len(record.calls)} model calls"
            + (f": {said[:500]}" if said else ""),
            metadata={"exit_code": str(run.exit_code), **({"signal": died} if died else {})},
        )
    if not record.calls:
        raise AgentProgramNoModelCall(
            "the agent program exited 0 without an answered model call through OPENAI_BASE_URL "
            f"({record.refused} refused)"
        )


def prepare_folder(base: Path, work: Path, uid: int | None) -> None:
    work.mkdir()
    if uid is not None:
        os.chmod(base, 0o711)
        os.chown(work, uid, uid)
        os.chmod(work, 0o700)


def program_environment(program: ProgramSpec, work: Path, variables: Mapping[str, str]) -> dict[str, str]:
    base = {k: os.environ[k] for k in _PASSED_THROUGH if k in os.environ}
    return {**base, "HOME": str(work), "TMPDIR": str(work), **program.env, **variables}


@contextlib.asynccontextmanager
async def loopback_relays(base: Path, urls: list[str]) -> AsyncIterator[list[list[Any]] | None]:
    """The scheduler's end of the program's network: for each loopback port of `urls` (the capture's,
    the tools'), a Unix socket in `base` over which the program's confinement hands over the socket
    listening on that port in its namespace (mesh/_confine.py); this process accepts the program's
    connections on it and serves them with that port's server when it runs here
    (mesh/loopback.py: the tool endpoint, an embedded gateway's facade), else relays each to that
    port. None (no network isolation) when a URL is not on loopback: a namespace with only loopback
    could not reach it."""
    ports: set[int] = set()
    for url in filter(None, urls):
        parts = urlsplit(url)
        if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
            yield None
            return
        ports.add(parts.port)
    handoffs: list[socket.socket] = []
    servers: list[asyncio.Server] = []
    takers: list[asyncio.Task[None]] = []
    try:
        forward: list[list[Any]] = []
        for port in sorted(ports):
            path = base / f"{port}.sock"
            handoff = socket.socket(socket.AF_UNIX)
            handoffs.append(handoff)
            handoff.bind(str(path))
            handoff.listen(8)
            handoff.setblocking(False)
            takers.append(asyncio.create_task(_take_listeners(handoff, port, servers)))
            forward.append([port, str(path)])
        yield forward
    finally:
        for task in takers:
            task.cancel()
        await asyncio.gather(*takers, return_exceptions=True)
        for server in servers:
            server.close()
        for handoff in handoffs:
            handoff.close()


async def _take_listeners(handoff: socket.socket, port: int, servers: list[asyncio.Server]) -> None:
    """Serve each listening socket handed over `handoff`: by the server of `port` itself when it
    runs in this process (mesh/loopback.py), else relaying its connections to `port`."""
    loop = asyncio.get_running_loop()
    while True:
        conn, _ = await loop.sock_accept(handoff)
        with conn:
            conn.setblocking(True)
            conn.settimeout(10.0)
            try:
                _, fds, _, _ = await asyncio.to_thread(socket.recv_fds, conn, 64, 1)
            except OSError:
                continue
        for fd in fds:
            listener = socket.socket(fileno=fd)
            factory = served_here(port)
            if factory is not None:
                servers.append(await loop.create_server(factory, sock=listener))
            else:
                servers.append(await asyncio.start_server(functools.partial(_relay, port), sock=listener))


async def _relay(port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass
    finally:
        if reader.at_eof():
            writer.close()


async def _run(program: ProgramSpec, process: RolloutProcess) -> HostRun:
    base, work, variables, stdin, forward, uid = (
        process.base,
        process.work,
        process.variables,
        process.stdin,
        process.forward,
        process.uid,
    )
    t0 = time.monotonic()
    mode_file = base / "sandbox"
    proc = await start_confined(program, work, variables, mode_file, forward=forward, uid=uid, stdin=True)
    run = HostRun()
    try:
        async with asyncio.timeout(program.timeout_s):
            readers = asyncio.gather(
                read_capped(proc.stdout, program.output_limit), read_capped(proc.stderr, program.output_limit)
            )
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
            (run.stdout, run.stdout_cut), (run.stderr, run.stderr_cut) = await readers
            run.exit_code = await proc.wait()
    except TimeoutError:
        run.timed_out = True
    finally:
        kill_group(proc)  # what it started dies with it, whatever happened
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
        run.seconds = time.monotonic() - t0
    run.sandbox = await asyncio.to_thread(read_mode, mode_file)
    return run


async def start_confined(
    program: ProgramSpec,
    work: Path,
    variables: Mapping[str, str],
    mode_file: Path,
    *,
    forward: list[list[Any]] | None,
    uid: int | None,
    expose: list[list[Any]] | None = None,
    stdin: bool = False,
) -> asyncio.subprocess.Process:
    """The program started through mesh/confine.py in `work` (its folder, the one place it writes)
    with `variables`, a session leader with its stdout and stderr piped (stdin too when asked);
    AGENT_PROGRAM_UNSTARTABLE when it cannot be started."""
    environment = program_environment(program, work, variables)
    argv = await resolved_argv(program, environment)
    readable = await asyncio.to_thread(program_paths, argv, environment.get("PATH"))
    confinement = Confinement(
        rlimits=program.rlimits,
        uid=uid,
        readable=readable,
        writable=(str(work),),
        hidden=program.hidden,
        forward=forward,
        expose=expose or [],
    )
    try:
        return await asyncio.create_subprocess_exec(
            *command(argv, confinement, mode_file),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=work,
            env=environment,
            start_new_session=True,  # no preexec_fn: grpc's fork handlers would run in the child
        )
    except OSError as exc:
        raise AgentProgramUnstartable(f"cannot start the agent program {program.argv[0]!r}: {exc}") from None


async def resolved_argv(program: ProgramSpec, environment: Mapping[str, str]) -> tuple[str, ...]:
    """The program's command line as it runs confined (a pyenv shim resolved: `_resolved_argv`);
    AGENT_PROGRAM_UNSTARTABLE, saying what to pass, when a shim names no interpreter."""
    try:
        return await asyncio.to_thread(_resolved_argv, program.argv, environment.get("PATH", ""))
    except ShimUnresolved as exc:
        raise AgentProgramUnstartable(str(exc)) from None


@functools.lru_cache(maxsize=64)
def _resolved_argv(argv: tuple[str, ...], path: str) -> tuple[str, ...]:
    """`argv` with a pyenv shim resolved (mesh/confine.py `resolve_shim`: a job submitted over the
    API may name one; `rollmesh run` resolves it where it runs), once per job's command."""
    return tuple(resolve_shim(argv, {**os.environ, "PATH": path}))


def _read_answer(path: Path) -> str | None:
    """The answer file's text; None when there is none. Never through a link (the program owns the
    folder, this process may read what it cannot): a link or a non-file is no answer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read().decode("utf-8", errors="replace")


def _extends(before: CapturedTurn, call: CapturedTurn) -> bool:
    """Does `call` continue `before`'s conversation? By token ids when both carry them (the prompt
    starts with the previous prompt + output), else by its messages starting with the previous ones."""
    prev, now = before.turn, call.turn
    if prev.prompt_token_ids and now.prompt_token_ids:
        kept = [*prev.prompt_token_ids, *prev.output_token_ids]
        return list(now.prompt_token_ids[: len(kept)]) == kept
    return _starts_with(call.messages, before.messages)


def _same(a: Json, b: Json) -> bool:
    return a.get("role") == b.get("role") and (a.get("content") or "") == (b.get("content") or "")


def _starts_with(messages: list[Json], prefix: list[Json]) -> bool:
    return len(messages) >= len(prefix) and all(_same(m, p) for m, p in zip(messages, prefix, strict=False))


def _mark_segments(record: CaptureRecord) -> int:
    """Mark each call that starts a new segment of the token record (`Turn.new_segment`: it does
    not extend the call before it); the number of segments."""
    for n, call in enumerate(record.calls):
        call.turn.new_segment = n > 0 and not _extends(record.calls[n - 1], call)
    return sum(c.turn.new_segment for c in record.calls) + 1


async def _outcome(
    record: CaptureRecord,
    prompt: list[Json],
    settings: AgentSettings,
    task: Json,
    env: EnvPort,
    session_id: str,
    answer: str | None,
) -> AgentOutcome:
    for n, call in enumerate(record.calls):
        if call.turn.finish_reason == "abort":
            raise GenerationAborted(
                f"model call {n + 1} of the agent program was aborted after "
                f"{len(call.turn.output_token_ids)} tokens: a cut answer is not scored"
            )
    # Each segment's last call holds its whole transcript (the calls before it in the segment extend it).
    segments: list[CapturedTurn] = []
    for call in record.calls:  # (marked by _mark_segments)
        if call.turn.new_segment or not segments:
            segments.append(call)
        else:
            segments[-1] = call
    messages: list[Json] = []
    for k, last in enumerate(segments):
        transcript = [*last.messages, last.turn.message]
        if _starts_with(transcript, prompt):
            transcript = transcript[len(prompt) :]
        if k > 0 and transcript:
            transcript[0] = {**transcript[0], SEGMENT_KEY: k}
        messages.extend(transcript)
    final = [{k: v for k, v in m.items() if k != SEGMENT_KEY} for m in _last_segment(messages)]
    if answer is not None:
        final.append({"role": "assistant", "content": answer})
    verdict = await env.verify(settings.environment, task, final, session_id)
    turns = [c.turn for c in record.calls]
    return AgentOutcome(
        messages=messages, verdict=verdict, turns=turns, finish_reason=turns[-1].finish_reason or "stop"
    )


def _last_segment(messages: list[Json]) -> list[Json]:
    starts = [i for i, m in enumerate(messages) if m.get(SEGMENT_KEY)]
    return messages[starts[-1] :] if starts else messages
