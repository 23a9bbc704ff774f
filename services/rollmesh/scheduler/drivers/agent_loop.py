"""The built-in agent loop of one rollout, over two small ports (model, environment).

seed session -> generate -> run tool calls on the verifier -> append results -> ... (up to
`max_steps` model turns, or until a tool's answer ends the agent: `ToolResult.ends_agent`, finish
reason "agent_timeout") -> verify (a turn that comes back aborted raises GenerationAborted, retryable:
a cut answer is never scored); the verifier and gateway sessions are closed in `finally`
(a one-turn rollout opens no gateway session; a stateless environment with a row that declares no
tools opens no verifier session: generate -> verify). An environment whose tool calls are the answer
(`AgentSettings.tool_calls_are_answer`) has none of them run: the first turn with calls ends the
rollout (finish reason "tool_calls") and is verified as it is.

Environment turns: a session seeded with `takes_turns` starts with the messages seeding gave (after
the row's input) and is stepped after every assistant turn (`EnvPort.step`, with the assistant
message and the results of its calls to the environment's own tools; calls to other tools are the
environment's to answer in its step): the step's messages are appended as prompt, and the loop
ends when a step says `done` (or at `max_steps`), whatever the turn's finish reason. The outcome's
reward is the steps' rewards plus verify's (`AgentOutcome.reward`).
The ports are Protocols: `remote.py` implements them over gRPC, tests with in-process fakes.
Messages are OpenAI chat-style dicts; tool calls are
`{"id", "type": "function", "function": {"name", "arguments"}}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Protocol
from typing import runtime_checkable

from rollmesh.mesh import responses_items
from rollmesh.mesh.chat import content_text
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.mesh.versions import VersionSpan
from rollmesh.scheduler.errors import GenerationAborted
from rollmesh.scheduler.errors import NoPrompt
from rollmesh.scheduler.records import RolloutKey

Json = dict[str, Any]
log = get_logger("rollmesh.scheduler.drivers.agent_loop")

CLOSE_TIMEOUT_S = 10.0


@dataclass
class GenerateCall:
    model: str
    messages: list[Json]
    tools: list[Json]  # {"name", "description", "parameters"} (parameters: a JSON Schema dict)
    sampling: Json
    session_id: str
    request_id: str


@dataclass
class Turn:
    """One model turn as the gateway returned it (what tokens.py builds the TokenRecord from)."""

    message: Json
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    replica_id: str = ""
    policy_version: str = ""
    first_token_s: float = 0.0  # the gateway's time to first output (0: not reported)
    #: Which policy version produced which output ids (offsets in `output_token_ids`), when more
    #: than one did (a CONTINUE weight update during the turn); `policy_version` is the first.
    versions: tuple[VersionSpan, ...] = ()
    #: The turn's prompt does not extend the ids before it (only an external program's turns: a
    #: compacted history, a sub-agent): it starts a new segment of the token record (tokens.py).
    new_segment: bool = False


@dataclass
class ToolResult:
    output: str
    is_error: bool = False
    #: The environment ends the agent with this answer (its time is up): the loop verifies now,
    #: finish reason "agent_timeout".
    ends_agent: bool = False


@dataclass
class SessionOpened:
    """A seeded environment session: its tools ({"name","description","parameters"}), the messages
    the episode starts with, and whether the environment answers turns (`EnvPort.step`)."""

    tools: list[Json] = field(default_factory=list)
    messages: list[Json] = field(default_factory=list)
    takes_turns: bool = False
    #: Tools this session offers besides `tools` (the environment's own, which CallTool answers): with
    #: `takes_turns` the step answers calls to them, else CallTool does.
    session_tools: list[Json] = field(default_factory=list)


@dataclass
class EnvStep:
    """The environment's answer to one assistant turn: messages to append (prompt), the step's
    reward, whether the episode is over, and what else it reported (`info`, kept in the row)."""

    messages: list[Json] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: Json = field(default_factory=dict)

    def record(self) -> Json:
        """The row's record of this step (`Rollout.env_steps`): its messages are in the row's output."""
        return {"reward": self.reward, "done": self.done, "info": self.info}


@dataclass(frozen=True)
class EnvDescription:
    """What the scheduler needs to know of an environment, fetched once per job."""

    tools: list[Json] = field(default_factory=list)
    #: No tools and no per-session state: Verify needs no session (the verifier's `stateless`).
    stateless: bool = False
    #: A turn's tool calls are its answer: none is run (the verifier's `tool_calls_are_answer`).
    tool_calls_are_answer: bool = False
    #: A task's rollouts are scored together (the verifier's `scores_groups`): `verify_group`.
    scores_groups: bool = False
    #: Task fields an external agent program may read besides the prompt (`public_fields`).
    public_fields: tuple[str, ...] = ()
    #: The environment's example dataset, a path on the verifier's machine ("" when none).
    example_dataset: str = ""
    #: One paragraph for humans.
    description: str = ""


@dataclass(frozen=True)
class GroupMember:
    """One rollout of a group, for `EnvPort.verify_group`: its messages after the prompt and its
    verifier session ("" when it has none)."""

    messages: list[Json]
    session_id: str = ""


class ModelPort(Protocol):
    async def generate(self, call: GenerateCall) -> Turn: ...

    async def close_session(self, session_id: str) -> None: ...

    async def engine_capacity(self, model: str) -> int:
        """Requests `model`'s engines run at once in all, over its healthy replicas ("" names the
        default model); 0 when unknown (an OpenAI-compatible URL reports none)."""
        ...


@runtime_checkable
class Responsive(Protocol):
    """A port whose service can be asked whether it answers at all (remote.py: a health check). The
    watchdog asks before it calls a service that keeps calls waiting hung (watchdog.py)."""

    async def responsive(self, timeout_s: float) -> bool: ...


class EnvPort(Protocol):
    async def seed_session(self, environment: str, task: Json, session_id: str) -> SessionOpened:
        """Open a session for the task: its tools, first messages and whether it takes turns."""
        ...

    async def call_tool(self, session_id: str, call: Json) -> ToolResult: ...

    async def step(self, session_id: str, messages: list[Json]) -> EnvStep:
        """The environment's answer to one assistant turn (`messages`: the assistant message, then
        the results of its tool calls); only for a session opened with `takes_turns`."""
        ...

    async def verify(
        self, environment: str, task: Json, messages: list[Json], session_id: str
    ) -> VerifyResult: ...

    async def verify_group(
        self, environment: str, task: Json, members: list[GroupMember]
    ) -> list[VerifyResult]:
        """The rollouts of one task scored together: one result per member, in order."""
        ...

    async def close_session(self, session_id: str) -> None: ...

    async def describe_environment(self, environment: str) -> EnvDescription:
        """Tools and statelessness; raises a NOT_FOUND error for an unknown environment."""
        ...


@dataclass
class AgentSettings:
    environment: str
    model: str = ""
    max_steps: int = 8
    system_prompt: str = ""
    sampling: Json = field(default_factory=dict)
    #: The environment is stateless (EnvDescription.stateless): rows without tools skip the session.
    stateless: bool = False
    #: A turn's tool calls are the answer (EnvDescription.tool_calls_are_answer): the loop runs none
    #: and ends at the first turn with calls.
    tool_calls_are_answer: bool = False
    #: The environment scores groups (EnvDescription.scores_groups): the loop does not verify; it
    #: returns with `AgentOutcome.verdict_pending` and the verifier session left open
    #: (`AgentOutcome.env_session`) for the engine's `verify_group` of the task's rollouts.
    group_verify: bool = False
    #: Task fields an external agent program may read besides the prompt (EnvDescription.public_fields).
    public_fields: tuple[str, ...] = ()


#: The verdict of an outcome whose group is not verified yet: masked, so it is in no reward figure
#: should it ever reach a row (the engine replaces it with the group's verdict before it writes).
PENDING_VERDICT = VerifyResult(0.0, masked=True, details={"pending": "the group's verdict"})


@dataclass
class AgentOutcome:
    messages: list[Json]
    verdict: VerifyResult
    turns: list[Turn]
    finish_reason: str
    #: The environment's answers to the turns, in order (empty when it takes no turns).
    steps: list[EnvStep] = field(default_factory=list)
    #: An external agent program's run (program.py), kept in the row; empty for this loop.
    program: Json = field(default_factory=dict)
    #: Not verified yet (`AgentSettings.group_verify`): `verdict` is PENDING_VERDICT until the
    #: group's verdict replaces it.
    verdict_pending: bool = False
    #: The verifier session left open for the group's verdict ("" when none); the engine closes it.
    env_session: str = ""

    @property
    def reward(self) -> float:
        """The rollout's reward: its steps' rewards plus verify's."""
        return sum((s.reward for s in self.steps), 0.0) + self.verdict.reward

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)


def responses_input(raw: Any) -> bool:
    """Whether a row's `input` list holds Responses items other than messages (`function_call`,
    `function_call_output`, `reasoning`: a NeMo Gym row that continues an episode); such a list is
    read as Responses items (mesh/responses_items.py), any other as chat messages."""
    return isinstance(raw, list) and any(
        isinstance(m, dict) and m.get("type", "message") != "message" for m in raw
    )


def has_prompt(task: Json) -> bool:
    """The row's `input` holds something (NeMo Gym's rows whose server gives the first observation
    at seed have `input: []`)."""
    return bool(task["responses_create_params"].get("input"))


def input_messages(task: Json, system_prompt: str = "") -> list[Json]:
    """The row's `responses_create_params` `instructions` (a system message) and `input` as chat
    messages (a system prompt prepended if none); "developer" is "system"."""
    params = task["responses_create_params"]
    raw = params["input"]
    msgs: list[Json] = []
    if params.get("instructions"):
        msgs.append({"role": "system", "content": str(params["instructions"])})
    chat: list[Json] = raw if isinstance(raw, list) else [{"role": "user", "content": raw}]
    if responses_input(raw):
        msgs += [m.to_openai() for m in responses_items.messages_from_items(raw, default_role="user")]
        chat = []
    for m in chat:
        msg: Json = {"role": str(m["role"]), "content": content_text(m.get("content"))}
        for extra in ("tool_calls", "tool_call_id", "name"):
            if m.get(extra):
                msg[extra] = m[extra]
        msgs.append(msg)
    for m in msgs:
        if m["role"] == "developer":
            m["role"] = "system"
    if system_prompt and not any(m["role"] == "system" for m in msgs):
        msgs.insert(0, {"role": "system", "content": system_prompt})
    return msgs


def row_tools(task: Json) -> list[Json]:
    """Tools declared on the row (Responses or Chat Completions shape) as name/description/parameters."""
    out: list[Json] = []
    for t in task["responses_create_params"].get("tools", []) or []:
        if not isinstance(t, dict):
            continue
        fn = t.get("function", t)
        if fn.get("name"):
            out.append(
                {
                    "name": str(fn["name"]),
                    "description": str(fn.get("description", "")),
                    "parameters": fn.get("parameters", {}) or {},
                }
            )
    return out


# A row's `responses_create_params` field -> the sampling field it overrides.
ROW_SAMPLING = (
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("max_output_tokens", "max_tokens"),
    ("max_tokens", "max_tokens"),
    ("top_k", "top_k"),
    ("stop", "stop"),
)


def row_sampling(task: Json, base: Json) -> Json:
    """Job sampling with the row's `responses_create_params` overrides applied."""
    params = task["responses_create_params"]
    s = dict(base)
    for src, dst in ROW_SAMPLING:
        if params.get(src) is not None:
            s[dst] = params[src]
    return s


def merge_tools(first: list[Json], second: list[Json]) -> list[Json]:
    if not second:  # (most rollouts: no set or generator built)
        return list(first)
    seen = {t["name"] for t in first}
    return [*first, *(t for t in second if t["name"] not in seen)]


async def run_agent(
    *,
    job_id: str,
    key: RolloutKey,
    task: Json,
    seed: int,
    settings: AgentSettings,
    model: ModelPort,
    env: EnvPort,
) -> AgentOutcome:
    """One attempt of one rollout; its sessions are always closed. A gateway session only carries
    kept ids and the replica to the next turn, so a one-turn rollout opens none (one RPC fewer); a
    verifier session is needed for per-session state or tool calls, so a stateless environment opens
    none unless the row declares tools of its own (two RPCs fewer)."""
    session_id = f"{job_id}/{key.task_index}/{key.rollout_index}"
    model_session = session_id if settings.max_steps > 1 else ""
    seeded = False
    generated = False
    kept = False  # the verifier session stays open for the group's verdict (the engine closes it)
    try:
        own_tools = row_tools(task)
        env_session = not settings.stateless or bool(own_tools)
        opened = SessionOpened()
        if env_session:
            opened = await env.seed_session(settings.environment, task, session_id)
            seeded = True
        tools = merge_tools(merge_tools(opened.tools, opened.session_tools), own_tools)
        sampling = row_sampling(task, settings.sampling)
        sampling["seed"] = seed
        prompt = input_messages(task, settings.system_prompt)
        new: list[Json] = list(opened.messages)
        if not new and not has_prompt(task):
            raise NoPrompt(
                f"the row's `responses_create_params.input` is empty and environment "
                f"{settings.environment!r} gave no first observation at seed: nothing to ask the model",
                metadata={"environment": settings.environment},
            )
        turns: list[Turn] = []
        steps: list[EnvStep] = []
        finish = "max_steps"
        for step in range(max(settings.max_steps, 1)):
            call = GenerateCall(
                model=settings.model,
                messages=[*prompt, *new],
                tools=tools,
                sampling=sampling,
                session_id=model_session,
                request_id=f"{session_id}/{step}",
            )
            generated = bool(model_session)
            turn = await model.generate(call)
            if turn.finish_reason == "abort":
                raise GenerationAborted(
                    f"model turn {step + 1} (request {call.request_id}) was aborted after "
                    f"{len(turn.output_token_ids)} tokens: a cut answer is not scored",
                    metadata={"request_id": call.request_id},
                )
            turns.append(turn)
            start = len(new)
            new.append(turn.message)
            calls = turn.message.get("tool_calls") or []
            if calls and turn.finish_reason == "tool_calls" and not settings.tool_calls_are_answer:
                if await run_tool_calls(env, session_id, calls, opened, new):
                    finish = "agent_timeout"  # the environment ended the agent (its time is up)
                    break
            elif not opened.takes_turns:
                # A turn cut by length (or that ended for an unknown reason) ends the rollout with
                # that reason and runs none of its calls: the model did not finish its turn.
                finish = turn.finish_reason or "stop"
                break
            if opened.takes_turns:
                answer = await env.step(session_id, new[start:])
                steps.append(answer)
                new.extend(answer.messages)
                if answer.done:
                    finish = turn.finish_reason or "stop"
                    break
        if settings.group_verify:
            kept = seeded
            return AgentOutcome(
                messages=new,
                verdict=PENDING_VERDICT,
                turns=turns,
                finish_reason=finish,
                steps=steps,
                verdict_pending=True,
                env_session=session_id if seeded else "",
            )
        verdict = await env.verify(settings.environment, task, new, session_id if env_session else "")
        return AgentOutcome(messages=new, verdict=verdict, turns=turns, finish_reason=finish, steps=steps)
    finally:
        await close_sessions(env if seeded and not kept else None, model if generated else None, session_id)


async def run_tool_calls(
    env: EnvPort, session_id: str, calls: list[Json], opened: SessionOpened, new: list[Json]
) -> bool:
    """Run a finished turn's tool calls on the verifier, appending their results to `new`; whether
    one of them ended the agent (`ToolResult.ends_agent`: every call still gets its answer). With
    environment turns, only calls to the environment's own tools: the rest are its step's to answer."""
    own = {t["name"] for t in opened.tools}
    ended = False
    for tc in calls:
        name = str(tc.get("function", {}).get("name", tc.get("name", "")))
        if opened.takes_turns and name not in own:
            continue
        result = await env.call_tool(session_id, tc)
        ended = ended or result.ends_agent
        new.append(
            {"role": "tool", "tool_call_id": str(tc.get("id", "")), "name": name, "content": result.output}
        )
    return ended


async def close_sessions(env: EnvPort | None, model: ModelPort | None, session_id: str) -> None:
    """Best effort, bounded: a failed close is logged, never turns a rollout into a failure."""
    closers = [port.close_session(session_id) for port in (env, model) if port is not None]
    if not closers:
        return
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            if len(closers) == 1:  # the common one-turn case: no gather, no extra task
                results: list[BaseException | None] = [await _settle(closers[0])]
            else:
                results = await asyncio.gather(*closers, return_exceptions=True)
    except TimeoutError:
        log.warning("session_close_timeout", session_id=session_id)
        return
    for r in results:
        if isinstance(r, Exception):
            log.debug("session_close_failed", session_id=session_id, error=str(r))


async def _settle(aw: Awaitable[None]) -> Exception | None:
    try:
        await aw
    except Exception as exc:
        return exc
    return None
