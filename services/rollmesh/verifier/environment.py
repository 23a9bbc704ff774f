"""The public plugin API: what an environment is.

A plugin in any repository writes::

    from rollmesh.verifier import Environment, Response, Session, Task, VerifyResult, tool

    class Counter(Environment):
        description = "Count up to the target."

        async def seed_session(self, task: Task) -> dict[str, int]:
            return {"count": int(task.metadata.get("start", 0))}

        @tool
        async def increment(self, session: Session, by: int) -> str:
            \"\"\"Add `by` to the counter.\"\"\"
            session.state["count"] += by
            return str(session.state["count"])

        async def verify(self, task: Task, response: Response, session: Session | None = None):
            ok = session is not None and session.state["count"] == task.expected_answer
            return VerifyResult(reward=1.0 if ok else 0.0)

and puts it in `environments/<name>/env.py` of an artifact root, or registers the class under the
`rollmesh.environments` entry-point group. Tools are async methods taking the session first and
then JSON-schema'd keyword arguments; the schema is inferred from the type hints unless given.
`verify` may be `async def` (do your own offloading) or a plain `def` (run in a worker thread).
CPU-heavy checks should use `self.context.workers` (processes with a hard timeout) instead.

Environment turns (a game, a user simulator, NeMo Gym's gymnasium servers' `/reset` + `/step`): an
environment that overrides `step` sees every assistant turn of a rollout and answers it::

    class Guess(Environment):
        async def seed_session(self, task: Task) -> Seeded:
            # The first observation: appended to the prompt before the first model turn.
            return Seeded(state={"tries": 0}, messages=(Message("user", "Guess 1..100."),))

        async def step(self, session: Session, turn: Response) -> EnvTurn:
            guess, target = turn.final_text.strip(), int(session.task.expected_answer)
            if guess == str(target):
                return EnvTurn(reward=1.0, done=True)
            hint = "higher" if guess.isdigit() and int(guess) < target else "lower"
            return EnvTurn(messages=(Message("user", hint),), reward=-0.1)

        def verify(self, task, response, session=None) -> VerifyResult:
            return VerifyResult(reward=0.0)  # the steps carry the reward

The agent loop (scheduler/drivers/agent_loop.py) runs: seed (its messages join the prompt) -> generate ->
run the turn's calls to the environment's own tools (as without turns) -> `step(session, turn)` with the
assistant message and those tool results -> append the `EnvTurn`'s messages (an observation as a
"user" message; an answer to a call the environment handles itself as a "tool" message with its
`tool_call_id`) -> ... until `done` or `max_steps` model turns; then `verify` as always. The
rollout's reward is the sum of the step rewards plus verify's reward (NeMo Gym's gymnasium agent
sums the step rewards; its servers have no verify, so a bridge's verify gives 0). The row records
each step's reward, `done` and `info`. The environment's messages are prompt: the token record never
trains on them. A turn that has no tool calls and is not done goes back to the model as it is (NeMo
Gym's gymnasium agent does the same). `takes_turns()` says whether `step` is called at all (default:
whether the class overrides it); no built-in takes turns.

Tools given at seed time: `Seeded(tools=...)` offers a session tools of its own besides the class's
`@tool`s (a server that lists its tools per session); see `Seeded.tools` for who answers them.
Tool calls as the answer: `tool_calls_are_answer()` True makes the loop run no call and end at the
first turn with calls, which verify then scores (NeMo Gym's non_executing_simple_agent).

Group scoring (a reward that depends on the other rollouts of the same task: verifiers' group
rubrics, a pairwise judge, a rank within the group): an environment that overrides `verify_group`
gets a task's rollouts together, one `Response` (and session) per rollout, and returns one
`VerifyResult` per rollout, in order::

    class Shortest(Environment):
        def verify_group(self, task, responses, sessions) -> list[VerifyResult]:
            sizes = [len(r.final_text) for r in responses]
            return [VerifyResult(reward=1.0 if n == min(sizes) else 0.0) for n in sizes]

        def verify(self, task, response, session=None) -> VerifyResult:
            raise NotImplementedError  # never called: the service refuses Verify (GROUP_SCORED)

The scheduler then runs the task's `num_repeats` rollouts, holds them (their sessions open) until
the last is done, calls `verify_group` once and writes the group's rows together; a rollout that
failed fails its whole group (docs/environments.md). `scores_groups()` says whether it does
(default: whether the class overrides `verify_group`).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
import types
import typing
from abc import ABC
from abc import abstractmethod
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import ClassVar
from typing import TypeVar
from typing import overload

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.chat import Message as Message  # re-exported: part of the plugin API
from rollmesh.mesh.chat import ToolCall as ToolCall
from rollmesh.mesh.chat import ToolSpec as ToolSpec
from rollmesh.mesh.chat import content_text
from rollmesh.mesh.errors import NotJson
from rollmesh.mesh.verify_result import VerifyResult as VerifyResult  # re-exported: plugin API
from rollmesh.verifier.errors import ToolError

if TYPE_CHECKING:
    from rollmesh.verifier.config import VerifierConfig
    from rollmesh.verifier.workers import WorkerPool

JsonObject = dict[str, Any]


# ---------------------------------------------------------------------------------------------------------
# Tasks and responses


@dataclass(frozen=True)
class Task:
    """One input row (NeMo Gym-compatible): `responses_create_params`, `expected_answer`, ..."""

    row: Mapping[str, Any]

    @property
    def expected_answer(self) -> Any:
        return self.row.get("expected_answer")

    @property
    def metadata(self) -> Mapping[str, Any]:
        """`verifier_metadata` (an empty mapping when absent or not an object)."""
        meta = self.row.get("verifier_metadata")
        return meta if isinstance(meta, Mapping) else {}

    @property
    def task_id(self) -> str:
        value = self.row.get("task_id", self.row.get("id", ""))
        return "" if value is None else str(value)

    @property
    def input_messages(self) -> list[Mapping[str, Any]]:
        params = self.row.get("responses_create_params")
        raw = params.get("input") if isinstance(params, Mapping) else None
        if isinstance(raw, str):
            return [{"role": "user", "content": raw}]
        return [m for m in raw if isinstance(m, Mapping)] if isinstance(raw, list) else []

    @property
    def prompt(self) -> str:
        """The text of the last user message ("" when none)."""
        users = (m for m in reversed(self.input_messages) if m.get("role") == "user")
        return next((content_text(m.get("content")) for m in users), "")


@dataclass(frozen=True)
class Response:
    """What the model produced after the input: assistant turns and tool results, in order."""

    messages: tuple[Message, ...] = ()

    @classmethod
    def from_text(cls, text: str) -> Response:
        return cls((Message("assistant", text),))

    @property
    def final_text(self) -> str:
        """The content of the last assistant message ("" when none)."""
        return next((m.content for m in reversed(self.messages) if m.role == "assistant"), "")

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [c for m in self.messages if m.role == "assistant" for c in m.tool_calls]

    def tool_output(self, call_id: str) -> str | None:
        return next(
            (m.content for m in self.messages if m.role == "tool" and m.tool_call_id == call_id), None
        )


@dataclass(frozen=True)
class Seeded:
    """What `seed_session` may return instead of the bare state: the state (`session.state`) and the
    messages the episode starts with (the first observation: appended to the prompt, after the
    row's input, before the first model turn; NeMo Gym's gymnasium `reset` observation)."""

    state: Any = None
    messages: tuple[Message, ...] = ()
    #: Tools this session offers besides the class's `@tool`s (a server that lists its tools per
    #: session): the model is offered them with the others. Calls to them are answered by `step` when
    #: the environment takes turns, else through `call_tool`, which an environment offering them
    #: overrides (the default knows only its `@tool`s). Available as `session.tools`.
    tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True)
class EnvTurn:
    """The environment's answer to one assistant turn (`Environment.step`).

    `messages` are appended to the conversation as prompt (never trained on): "user" messages (an
    observation, a simulated user's reply) and "tool" messages answering calls of the turn that the
    environment handles itself (`tool_call_id` set); an "assistant" message is refused, since the
    policy did not write it. `reward` is this step's (summed with the other steps' and verify's into
    the rollout's reward), `done` ends the episode, and `info` (a JSON object) is recorded in the row.
    """

    messages: tuple[Message, ...] = ()
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class Session:
    """One rollout's state inside an environment. `state` is whatever `seed_session` returned."""

    id: str
    environment: str
    task: Task
    state: Any = None
    #: The tools this session offers besides the class's `@tool`s (`Seeded.tools`).
    tools: tuple[ToolSpec, ...] = ()


#: The id of the session being seeded, while `seed_session` runs (the service sets it).
_SEEDING: contextvars.ContextVar[str] = contextvars.ContextVar("rollmesh_seeding_session", default="")


def seeding_session_id() -> str:
    """The id of the session `seed_session` is seeding ("" outside a seed): the scheduler's are
    `<job>/<task index>/<rollout index>`, so an environment can label what it makes for the rollout."""
    return _SEEDING.get()


# ---------------------------------------------------------------------------------------------------------
# Tools


@dataclass(frozen=True)
class ToolOutput:
    call_id: str
    output: str
    is_error: bool = False
    #: The environment ends the agent with this answer (its time is up): the loop verifies now.
    ends_agent: bool = False


ToolFn = Callable[..., Awaitable[Any]]
F = TypeVar("F", bound=ToolFn)

_TOOL_ATTR = "__rollmesh_tool__"
_PY_TO_JSON: dict[Any, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    dict: "object",
}


def _schema_for(annotation: Any) -> JsonObject:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _schema_for(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(annotation))}
    base = origin or annotation
    if base in _PY_TO_JSON:
        schema: JsonObject = {"type": _PY_TO_JSON[base]}
        if base is list and typing.get_args(annotation):
            schema["items"] = _schema_for(typing.get_args(annotation)[0])
        return schema
    return {}


def infer_parameters(fn: ToolFn) -> JsonObject:
    """A JSON Schema for the keyword arguments after (self, session), from the type hints."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = list(sig.parameters.values())[2:]
    props: JsonObject = {}
    required: list[str] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        props[p.name] = _schema_for(hints.get(p.name, Any))
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


@overload
def tool(fn: F, /) -> F: ...
@overload
def tool(
    *, name: str | None = None, description: str | None = None, parameters: JsonObject | None = None
) -> Callable[[F], F]: ...
def tool(
    fn: F | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: JsonObject | None = None,
) -> F | Callable[[F], F]:
    """Mark an async method `(self, session, **kwargs)` as a tool the model may call.

    The name defaults to the method's, the description to the docstring's first paragraph, and the
    parameters' JSON Schema to one inferred from the type hints.
    """

    def mark(f: F) -> F:
        is_async: bool = inspect.iscoroutinefunction(f)
        if not is_async:
            raise TypeError(f"tool {f.__name__!r} must be an async method")
        doc = inspect.getdoc(f) or ""
        spec = ToolSpec.of(
            name or f.__name__,
            description if description is not None else doc.split("\n\n")[0].strip(),
            parameters if parameters is not None else infer_parameters(f),
        )
        setattr(f, _TOOL_ATTR, spec)
        return f

    return mark(fn) if fn is not None else mark


# ---------------------------------------------------------------------------------------------------------
# JSON Schema (the subset tools use: type, properties, required, additionalProperties, enum, items, bounds)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def schema_errors(value: Any, schema: Mapping[str, Any], path: str = "arguments") -> list[str]:
    """Why `value` does not match `schema` (empty when it does)."""
    errs: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        ok = any(
            isinstance(value, _JSON_TYPES.get(n, (object,)))
            and not (n in ("integer", "number") and isinstance(value, bool))
            for n in names
        )
        if not ok:
            return [f"{path} must be {' or '.join(names)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path} must be one of {schema['enum']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errs.append(f"{path} must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errs.append(f"{path} must be <= {schema['maximum']}")
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties", {})
        for req in schema.get("required", []):
            if req not in value:
                errs.append(f"{path}.{req} is required")
        for key, item in value.items():
            if key in props:
                errs.extend(schema_errors(item, props[key], f"{path}.{key}"))
            elif schema.get("additionalProperties") is False:
                errs.append(f"{path}.{key} is not a known parameter")
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            errs.extend(schema_errors(item, schema["items"], f"{path}[{i}]"))
    return errs


# ---------------------------------------------------------------------------------------------------------
# The environment


@dataclass(frozen=True)
class EnvContext:
    """What the service gives an environment: its folder (None for entry points), config, a worker pool."""

    name: str
    path: Path | None
    config: VerifierConfig
    workers: WorkerPool


class Environment(ABC):
    """Subclass this; implement `verify`; add `@tool` methods and `seed_session` as needed."""

    #: Defaults to the folder name (or entry-point name).
    name: ClassVar[str] = ""
    #: One paragraph for humans; defaults to the class docstring.
    description: ClassVar[str] = ""

    def __init__(self, context: EnvContext) -> None:
        self.context = context

    async def start(self) -> None:
        """Called once after loading (start worker pools, open channels). Default: nothing."""
        return

    async def aclose(self) -> None:
        """Called once on shutdown. Default: nothing."""
        return

    def sandbox_mode(self) -> str:
        """How this environment isolates untrusted code it runs, as ListEnvironments shows it
        ("namespaces", "unsafe-process"); "" (the default) when it runs none."""
        return ""

    async def seed_session(self, task: Task) -> Any:
        """Create the per-session state for `task` (available as `session.state`). Default: None.

        Return a `Seeded` to also give the messages the episode starts with (a first observation)."""
        del task
        return None

    def tool_calls_are_answer(self) -> bool:
        """Whether a turn's tool calls are the model's answer rather than requests to run (NeMo Gym's
        non_executing_simple_agent: xlam_fc, structured-output rows): the agent loop then runs none
        of them, ends the rollout at the first turn with calls (finish reason "tool_calls") and
        verifies it, calls included. Default: False (calls are run and the model goes on)."""
        return False

    def public_fields(self) -> Sequence[str]:
        """Top-level fields of a task row an external agent program may read (its task document's
        `task`), besides `responses_create_params`, which is the prompt. Never the gold
        (`expected_answer`) nor anything `verify` scores against: what a program can read, the
        policy can learn to read. Default: none."""
        return ()

    def scores_groups(self) -> bool:
        """Whether a rollout's reward depends on the other rollouts of its task, so the scheduler
        verifies a task's rollouts together (`verify_group`) and never one alone. Default: whether
        the class overrides `verify_group` (a bridge, known only once loaded, overrides this)."""
        return type(self).verify_group is not Environment.verify_group

    def verify_group(
        self, task: Task, responses: Sequence[Response], sessions: Sequence[Session | None]
    ) -> Sequence[VerifyResult] | Awaitable[Sequence[VerifyResult]]:
        """Score the rollouts of one task together: one result per response, in order (`sessions[i]`
        is `responses[i]`'s session, None when it has none). May be `async def` or a plain `def`
        (run in a worker thread), as `verify`. Default: not a group-scored environment."""
        del task, responses, sessions
        raise NotImplementedError(f"{type(self).__name__} does not score groups")

    def verify_timeout_s(self, task: Task) -> float | None:
        """How long `verify` (or `verify_group`) of `task` may take, when the verifier's
        ROLLMESH_VERIFIER_VERIFY_TIMEOUT_S is not the bound (a task that names its own grading time:
        container tasks' `[verifier] timeout_sec`). Default: None (the verifier's setting)."""
        del task
        return None

    def takes_turns(self) -> bool:
        """Whether the agent loop calls `step` after each assistant turn. Default: whether the class
        overrides `step` (an environment whose kind is known only once loaded, a bridge, overrides
        this instead)."""
        return type(self).step is not Environment.step

    async def step(self, session: Session, turn: Response) -> EnvTurn:
        """Answer one assistant turn: `turn` holds the assistant message and the results of its
        calls to this environment's tools, in order. Default: none (no environment turns)."""
        del session, turn
        return EnvTurn(done=True)

    async def close_session(self, session: Session) -> None:
        """Release what `seed_session` made outside this process (a bridged server's session).
        Called when the rollout closes its session, or when the session expired idle (a driver
        that died without closing it); a failure is logged, never the rollout's.
        Default: nothing."""
        del session
        return

    def problem(self) -> str:
        """Why it cannot serve right now ("" when it can): a bridged server that is down. While it
        is non-empty ListEnvironments lists the environment as broken, with this text."""
        return ""

    def server_restarts(self) -> int:
        """How many times the server this environment bridges to was restarted since the verifier
        started it (a managed server; metrics). Default: 0 (nothing out of process)."""
        return 0

    def listed_tools(self) -> list[ToolSpec]:
        """The tools `rollmesh envs show` lists. Default: the `@tool` methods (a bridge: its
        server's tool routes)."""
        return self.tool_specs()

    def summary(self) -> str:
        """One line for humans. Default: `describe()` (the description or the class docstring)."""
        return self.describe()

    @abstractmethod
    def verify(
        self, task: Task, response: Response, session: Session | None = None
    ) -> VerifyResult | Awaitable[VerifyResult]:
        """Score `response` for `task` (and the session's state, when there is one)."""

    # -- helpers the service uses ---------------------------------------------------------------------

    @classmethod
    def tool_specs(cls) -> list[ToolSpec]:
        return [spec for spec, _ in cls._tools().values()]

    @classmethod
    @functools.cache
    def _tools(cls) -> dict[str, tuple[ToolSpec, str]]:
        """The class's tools by name, with their attributes (a class's tools are fixed once it is
        loaded: found once per class, not by walking dir(cls) per SeedSession or tool call)."""
        found: dict[str, tuple[ToolSpec, str]] = {}
        for attr in dir(cls):
            fn = getattr(cls, attr, None)
            spec = getattr(fn, _TOOL_ATTR, None)
            if isinstance(spec, ToolSpec):
                found[spec.name] = (spec, attr)
        return found

    @classmethod
    def describe(cls) -> str:
        text = cls.description or (inspect.getdoc(cls) or "").split("\n\n")[0]
        return " ".join(text.split())

    async def call_tool(self, session: Session, call: ToolCall) -> ToolOutput:
        """Run one tool call. Bad JSON, schema violations and tool exceptions become error outputs.

        An unknown tool name raises KeyError (the service maps it to NOT_FOUND).
        """
        tools = self._tools()
        if call.name not in tools:
            raise KeyError(call.name)
        spec, attr = tools[call.name]
        try:
            args = untrusted_json.loads(call.arguments_json) if call.arguments_json.strip() else {}
        except NotJson as exc:
            return ToolOutput(call.id, f"error: arguments are not valid JSON: {exc}", True)
        problems = schema_errors(args, spec.parameters)
        if problems:
            return ToolOutput(call.id, "error: " + "; ".join(problems), True)
        try:
            result = await getattr(self, attr)(session, **args)
        except ToolError as exc:
            return ToolOutput(call.id, f"error: {exc}", True)
        except Exception as exc:
            return ToolOutput(call.id, f"error: {type(exc).__name__}: {exc}", True)
        return ToolOutput(call.id, result if isinstance(result, str) else json.dumps(result))
