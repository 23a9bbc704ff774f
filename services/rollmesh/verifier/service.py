"""The verifier's domain layer: environments, sessions, tool calls and verification (no grpc here)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import numbers
import time
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.errors import Internal
from rollmesh.mesh.errors import NotJson
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.registry.catalog import Catalog
from rollmesh.verifier import telemetry
from rollmesh.verifier.config import VerifierConfig
from rollmesh.verifier.environment import _SEEDING
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import Environment
from rollmesh.verifier.environment import EnvTurn
from rollmesh.verifier.environment import Message
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import Seeded
from rollmesh.verifier.environment import Session
from rollmesh.verifier.environment import Task
from rollmesh.verifier.environment import ToolOutput
from rollmesh.verifier.errors import BadEnvTurn
from rollmesh.verifier.errors import BadGroup
from rollmesh.verifier.errors import BadTask
from rollmesh.verifier.errors import EnvironmentBroken
from rollmesh.verifier.errors import EnvironmentNotFound
from rollmesh.verifier.errors import GroupScored
from rollmesh.verifier.errors import TakesNoTurns
from rollmesh.verifier.errors import ToolNotFound
from rollmesh.verifier.errors import VerifyTimeout
from rollmesh.verifier.loader import Broken
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.loader import discover
from rollmesh.verifier.sessions import Clock
from rollmesh.verifier.sessions import SessionStore
from rollmesh.verifier.workers import WorkerPool

log = get_logger("rollmesh.verifier")


@dataclass(frozen=True)
class EnvironmentInfo:
    name: str
    description: str
    tools: list[ToolSpec]
    source: str
    example_dataset: str
    #: No tools and no `seed_session` override: verification needs no session (see `is_stateless`).
    stateless: bool = False
    #: How it isolates the untrusted code it runs (`Environment.sandbox_mode`); "" when it runs none.
    sandbox: str = ""
    #: It answers assistant turns (`Environment.takes_turns`): its sessions are stepped.
    takes_turns: bool = False
    #: A turn's tool calls are its answer (`Environment.tool_calls_are_answer`): none is run.
    tool_calls_are_answer: bool = False
    #: A task's rollouts are scored together (`Environment.scores_groups`): VerifyGroup, never Verify.
    scores_groups: bool = False
    #: Task fields an external agent program may read besides the prompt (`Environment.public_fields`).
    public_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class SeededSession:
    """What SeedSession answers: the session, its tools, the messages the episode starts with, and
    whether the environment takes turns."""

    session: Session
    tools: list[ToolSpec]
    messages: tuple[Message, ...] = ()
    takes_turns: bool = False
    #: Tools this session offers besides `tools` (the environment's own): `Seeded.tools`.
    session_tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True)
class VerifyCall:
    environment: str
    task_json: str
    response: Response
    session_id: str = ""


@dataclass(frozen=True)
class GroupMember:
    response: Response
    session_id: str = ""


@dataclass(frozen=True)
class GroupCall:
    """The rollouts of one task, verified together (VerifyGroup)."""

    environment: str
    task_json: str
    members: tuple[GroupMember, ...]


def parse_task(task_json: str) -> Task:
    try:
        row = untrusted_json.loads(task_json) if task_json.strip() else {}
    except NotJson as exc:
        raise BadTask(f"task_json is not valid JSON: {exc}") from None
    if not isinstance(row, dict):
        raise BadTask(f"task_json must be a JSON object, got {type(row).__name__}")
    return Task(row)


def is_stateless(cls: type[Environment]) -> bool:
    """True when `cls` offers no tools, keeps the base `seed_session` (which returns None) and the base
    `step` (it takes no turns; `describe` also asks the loaded instance's `takes_turns`).

    A session of such an environment carries nothing `verify` could use beyond the task it is given
    anyway, so callers may skip SeedSession/CloseSession and call Verify without a session_id.
    """
    return (
        not cls.tool_specs()
        and getattr(cls, "seed_session", None) is Environment.seed_session
        and getattr(cls, "step", None) is Environment.step
    )


_TURN_ROLES = ("user", "tool", "system")


def _check_messages(name: str, what: str, messages: Any) -> tuple[Message, ...]:
    """An environment's messages for the conversation, or BadEnvTurn: they must be `Message`s the
    policy did not write (never "assistant": the token record would count it as the policy's turn)."""
    if not isinstance(messages, tuple | list) or not all(isinstance(m, Message) for m in messages):
        raise BadEnvTurn(f"environment {name!r} {what} messages must be a sequence of Message")
    bad = [m.role for m in messages if m.role not in _TURN_ROLES]
    if bad:
        raise BadEnvTurn(
            f"environment {name!r} {what} returned a message with role {bad[0]!r}; "
            f"allowed: {', '.join(_TURN_ROLES)}"
        )
    return tuple(messages)


def _check_tools(name: str, tools: Any, own: list[ToolSpec]) -> tuple[ToolSpec, ...]:
    """A session's own tools (`Seeded.tools`), or BadEnvTurn: `ToolSpec`s whose names are unique and
    none of the environment's `@tool`s (the model would be offered one name twice)."""
    if not isinstance(tools, tuple | list) or not all(isinstance(t, ToolSpec) for t in tools):
        raise BadEnvTurn(f"environment {name!r} seed_session tools must be a sequence of ToolSpec")
    seen = {t.name for t in own}
    for t in tools:
        if not t.name or t.name in seen:
            why = "has no name" if not t.name else f"{t.name!r} is offered twice"
            raise BadEnvTurn(f"environment {name!r} seed_session returned a tool that {why}")
        seen.add(t.name)
    return tuple(tools)


def _check_turn(name: str, turn: Any) -> EnvTurn:
    """The environment's step answer, or BadEnvTurn (see `_check_messages`; the reward must be a
    finite number and `info` a JSON object)."""
    if not isinstance(turn, EnvTurn):
        raise BadEnvTurn(f"environment {name!r} step returned {type(turn).__name__}, not EnvTurn")
    messages = _check_messages(name, "step", turn.messages)
    reward = turn.reward
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise BadEnvTurn(f"environment {name!r} step returned reward = {reward!r:.80}, not a finite number")
    if not isinstance(turn.info, Mapping):
        raise BadEnvTurn(f"environment {name!r} step returned info of type {type(turn.info).__name__}")
    try:
        info = json.loads(json.dumps(dict(turn.info), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise BadEnvTurn(f"environment {name!r} step returned info that is not JSON: {exc}") from None
    return EnvTurn(messages=messages, reward=float(reward), done=bool(turn.done), info=info)


def _check_result(name: str, result: Any) -> VerifyResult:
    """The environment's result, or Internal when it is not a VerifyResult or its reward or a
    component is not a finite number (a NaN would poison every mean and pass@k it enters, an
    inf or a string has no meaning as a reward): the verify fails, visibly, instead."""
    if not isinstance(result, VerifyResult):
        raise Internal(f"environment {name!r} verify returned {type(result).__name__}, not VerifyResult")
    if bad := result.not_finite():
        raise Internal(f"environment {name!r} verify returned {bad}, not a finite number")
    return result


class VerifierService:
    """Everything the EnvironmentVerifier RPCs do, callable without a server."""

    def __init__(self, config: VerifierConfig, discovery: Discovery, *, clock: Clock | None = None) -> None:
        self.config = config
        self._loaded = discovery.loaded
        self._broken = discovery.broken
        self.sessions = SessionStore(
            ttl_s=config.session_ttl_s,
            max_sessions=config.max_sessions,
            **({"clock": clock} if clock is not None else {}),
        )
        self._tasks = TaskSet()
        self._started = False
        telemetry.LIVE.watch(self.live_state)  # sessions open, environments up: read at scrape time

    # -- lifecycle ------------------------------------------------------------------------------------

    @staticmethod
    def context_factory(config: VerifierConfig) -> Any:
        def make(name: str, path: Path | None) -> EnvContext:
            pool = WorkerPool(config.workers, name=f"{name}-workers")
            return EnvContext(name=name, path=path, config=config, workers=pool)

        return make

    @classmethod
    def from_catalog(
        cls,
        config: VerifierConfig,
        catalog: Catalog,
        *,
        clock: Clock | None = None,
        entry_points: bool = True,
    ) -> VerifierService:
        """Discover plugins (blocking imports) and build the service; call `start()` next."""
        found = discover(catalog, cls.context_factory(config), entry_points=entry_points)
        return cls(config, found, clock=clock)

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        # At once: an environment that starts a server (a managed NeMo Gym sidecar) takes seconds.
        await asyncio.gather(*(self._start_one(item) for item in list(self._loaded.values())))
        for name in self._loaded:
            telemetry.at_zero(name)
        self._tasks.spawn(self._sweep(), name="verifier-session-sweeper")

    async def _start_one(self, item: Loaded) -> None:
        """Start one environment; one that fails is listed broken with its one-line error."""
        try:
            await item.env.start()
        except Exception as exc:
            error = exc.message if isinstance(exc, RollmeshError) else f"{type(exc).__name__}: {exc}"
            log.warning("environment_start_failed", name=item.name, error=error)
            self._broken[item.name] = Broken(item.name, item.source, error)
            del self._loaded[item.name]
            try:
                await item.env.aclose()
            except Exception as close_exc:
                log.warning("environment_close_failed", name=item.name, error=str(close_exc))

    async def _sweep(self) -> None:
        interval = min(max(self.config.session_ttl_s / 4, 0.5), 60.0)
        while True:
            await asyncio.sleep(interval)
            dropped = self.sessions.evict_expired()
            if dropped:
                log.info("sessions_expired", count=dropped, open=len(self.sessions))
            for session in self.sessions.take_expired():  # (evicted here or by any other call)
                await self._release(session)

    async def aclose(self) -> None:
        await self._tasks.aclose()
        self.sessions.clear()
        for item in self._loaded.values():
            try:
                await item.env.aclose()
            except Exception as exc:
                log.warning("environment_close_failed", name=item.name, error=str(exc))
            await item.env.context.workers.aclose()

    # -- environments ---------------------------------------------------------------------------------

    def _env(self, name: str) -> Loaded:
        item = self._loaded.get(name)
        if item is not None:
            return item
        bad = self._broken.get(name)
        if bad is not None:
            if bad.exc is not None:
                raise bad.exc
            raise EnvironmentBroken(
                f"environment {name!r} failed to load from {bad.source}: {bad.error}",
                metadata={"environment": name, "source": bad.source},
            )
        known = ", ".join(sorted(self._loaded)) or "(none)"
        raise EnvironmentNotFound(
            f"no environment named {name!r}; loaded: {known}", metadata={"environment": name}
        )

    def live_state(self) -> telemetry.VerifierNow:
        """Sessions open and the environments, as a metrics scrape reads them (on the endpoint's
        thread: copies only)."""
        loaded = tuple(
            telemetry.EnvironmentNow(
                item.name,
                not item.env.problem(),
                item.env.server_restarts(),
                item.env.context.workers.waiting,
                item.env.context.workers.busy,
            )
            for item in list(self._loaded.values())
        )
        return telemetry.VerifierNow(len(self.sessions), loaded, tuple(self._broken))

    def environment(self, name: str) -> Environment:
        return self._env(name).env

    def list_environments(self) -> tuple[list[EnvironmentInfo], list[Broken]]:
        """Loaded environments, and broken ones: those that failed to load and those that cannot
        serve right now (`Environment.problem`: a bridged server that is down)."""
        down = {n: item for n, item in self._loaded.items() if item.env.problem()}
        infos = [self.describe(n) for n in sorted(self._loaded) if n not in down]
        broken = {**self._broken, **{n: Broken(n, i.source, i.env.problem()) for n, i in down.items()}}
        return infos, [broken[n] for n in sorted(broken)]

    def describe(self, name: str) -> EnvironmentInfo:
        item = self._env(name)
        cls = type(item.env)
        return EnvironmentInfo(
            name,
            item.env.summary(),
            item.env.listed_tools(),
            item.source,
            item.example_dataset,
            stateless=is_stateless(cls) and not item.env.takes_turns(),
            sandbox=item.env.sandbox_mode(),
            takes_turns=item.env.takes_turns(),
            tool_calls_are_answer=item.env.tool_calls_are_answer(),
            scores_groups=item.env.scores_groups(),
            public_fields=tuple(item.env.public_fields()),
        )

    # -- sessions -------------------------------------------------------------------------------------

    async def seed_session(self, environment: str, task_json: str, session_id: str = "") -> SeededSession:
        item = self._env(environment)
        task = parse_task(task_json)
        sid = self.sessions.new_id(session_id)
        self.sessions.reserve(sid)
        seeding = _SEEDING.set(sid)
        try:
            state = await item.env.seed_session(task)
        finally:
            _SEEDING.reset(seeding)
        messages: tuple[Message, ...] = ()
        own = type(item.env).tool_specs()
        extra: tuple[ToolSpec, ...] = ()
        if isinstance(state, Seeded):
            messages = _check_messages(environment, "seed_session", state.messages)
            extra = _check_tools(environment, state.tools, own)
            state = state.state
        session = Session(id=sid, environment=environment, task=task, state=state, tools=extra)
        self.sessions.add(session)  # re-checks: another seed may have raced in during seed_session
        return SeededSession(session, own, messages, item.env.takes_turns(), extra)

    async def call_tool(self, session_id: str, call: ToolCall) -> ToolOutput:
        session = self.sessions.get(session_id)
        failure: BaseException | None = None
        try:
            return await self._call_tool(session, call)
        except Exception as exc:
            failure = exc
            raise
        finally:
            telemetry.TOOL_CALLS.labels(session.environment, telemetry.outcome(failure)).inc()

    async def _call_tool(self, session: Session, call: ToolCall) -> ToolOutput:
        env = self._env(session.environment).env
        async with self.sessions.lock(session.id):
            try:
                return await env.call_tool(session, call)
            except KeyError:
                names = ", ".join(s.name for s in (*type(env).tool_specs(), *session.tools)) or "(none)"
                raise ToolNotFound(
                    f"environment {session.environment!r} has no tool {call.name!r}; tools: {names}",
                    metadata={"environment": session.environment, "tool": call.name},
                ) from None

    async def step(self, session_id: str, turn: Response) -> EnvTurn:
        """The environment's answer to one assistant turn of the session (under the session's lock,
        as tool calls are), checked (`_check_turn`)."""
        session = self.sessions.get(session_id)
        env = self._env(session.environment).env
        if not env.takes_turns():
            raise TakesNoTurns(
                f"environment {session.environment!r} takes no turns: its sessions are not stepped",
                metadata={"environment": session.environment},
            )
        async with self.sessions.lock(session_id):
            answer = await env.step(session, turn)
        return _check_turn(session.environment, answer)

    async def close_session(self, session_id: str) -> None:
        await self._release(self.sessions.close(session_id))

    async def _release(self, session: Session) -> None:
        """Tell the session's environment it is over (`close_session`): closed, or expired idle."""
        session_id = session.id
        item = self._loaded.get(session.environment)
        if item is None:
            return
        try:
            await item.env.close_session(session)
        except Exception as exc:  # the rollout is done: a failed release is logged, not its failure
            log.warning("session_release_failed", session_id=session_id, error=f"{type(exc).__name__}: {exc}")

    # -- verification ---------------------------------------------------------------------------------

    async def verify(self, call: VerifyCall) -> VerifyResult:
        with self._counted(call.environment):
            return await self._verify(call)

    @contextlib.contextmanager
    def _counted(self, environment: str) -> Iterator[None]:
        """A verify (or a group's) in the environment's counters: its outcome and its seconds."""
        start, failure = time.perf_counter(), None
        try:
            yield
        except Exception as exc:
            failure = exc
            raise
        finally:
            if environment in self._loaded:  # (an unknown name is no label: it is unbounded)
                telemetry.VERIFIES.labels(environment, telemetry.outcome(failure)).inc()
                telemetry.VERIFY_SECONDS.labels(environment).observe(time.perf_counter() - start)

    async def _verify(self, call: VerifyCall) -> VerifyResult:
        item = self._env(call.environment)
        if item.env.scores_groups():
            raise GroupScored(
                f"environment {call.environment!r} scores a task's rollouts together (verify_group): "
                "one rollout alone has no reward; verify its group (VerifyGroup)",
                metadata={"environment": call.environment},
            )
        task = parse_task(call.task_json)
        session = self.sessions.get(call.session_id, call.environment) if call.session_id else None
        bound = item.env.verify_timeout_s(task)
        result = await self._bounded(
            call.environment, item.env.verify, task, call.response, session, timeout_s=bound
        )
        return _check_result(call.environment, result)

    async def _bounded(self, environment: str, fn: Any, *args: Any, timeout_s: float | None = None) -> Any:
        """`fn(*args)` under the verify timeout (the environment's own for the task, when it names one):
        awaited when `async def`, else in a worker thread."""
        limit = timeout_s or self.config.verify_timeout_s
        try:
            async with asyncio.timeout(limit):
                if inspect.iscoroutinefunction(fn):
                    return await fn(*args)
                result = await asyncio.to_thread(fn, *args)  # a plain def: keep it off the event loop
                return await result if inspect.isawaitable(result) else result
        except TimeoutError:
            where = "the environment's bound" if timeout_s else "ROLLMESH_VERIFIER_VERIFY_TIMEOUT_S"
            raise VerifyTimeout(f"verify in {environment!r} took longer than {limit:g}s ({where})") from None

    async def verify_group(self, call: GroupCall) -> list[VerifyResult]:
        """The rollouts of one task scored together (`Environment.verify_group`): one checked result
        per member, in order. Refused (BadGroup) without members, on an environment that does not
        score groups, or when the environment answers another number of results."""
        with self._counted(call.environment):
            return await self._verify_group(call)

    async def _verify_group(self, call: GroupCall) -> list[VerifyResult]:
        name = call.environment
        item = self._env(name)
        if not item.env.scores_groups():
            raise BadGroup(
                f"environment {name!r} scores each rollout alone: use Verify", metadata={"environment": name}
            )
        if not call.members:
            raise BadGroup("VerifyGroup needs at least one member", metadata={"environment": name})
        task = parse_task(call.task_json)
        sessions = [self.sessions.get(m.session_id, name) if m.session_id else None for m in call.members]
        responses = [m.response for m in call.members]
        results = await self._bounded(name, item.env.verify_group, task, responses, sessions)
        if not isinstance(results, list | tuple) or len(results) != len(call.members):
            got = len(results) if isinstance(results, list | tuple) else type(results).__name__
            raise BadGroup(
                f"environment {name!r} verify_group answered {got} results for {len(call.members)} rollouts",
                metadata={"environment": name},
            )
        return [_check_result(name, r) for r in results]
