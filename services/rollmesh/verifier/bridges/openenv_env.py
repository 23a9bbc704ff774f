"""An OpenEnv environment (Meta's `openenv-core`: a server with typed Action and Observation models,
`/reset`, `/step`, `/state`, `/schema` and a WebSocket session at `/ws`) behind the Environment API:
the episode runs as environment turns (docs/environment-turns.md), no port to env.py needed.

Declared as `environments/<name>/openenv.toml` in any artifact root (no env.py):

    url = "http://127.0.0.1:8000"        # attach: a server the user runs (a container, a Space, uvicorn)
    # or managed (no url): the verifier runs the server's app in an OpenEnv virtualenv and supervises it
    env_dir = "my_env"                   # an OpenEnv environment folder (`openenv init`'s layout: its
                                         # openenv.yaml names the app, `server.app:app`), relative to
                                         # this folder or absolute
    # or  app = "echo_env.server.app:app"  (the app of an installed environment package)
    python = "/opt/openenv/bin/python"   # its interpreter (or venv = "..."; default ROLLMESH_OPENENV_PYTHON)
    action = "auto"                      # how a turn becomes an action: "text", "tool" or "auto" (below)
    text_field = ""                      # "text": the action field the model's text fills (default: the
                                         # schema's only string field)
    tool_name = "act"                    # "tool": the name of the tool whose arguments are the action
    observation_field = ""               # the observation field whose text is the message (default: the
                                         # observation as JSON)
    max_sessions = 0                     # at most this many episodes open at once (the server's
                                         # max_concurrent_envs; 0: no bound)
    timeout_s = 60                       # per call
    [reset]                              # reset's keyword arguments (seed, episode_id, ...)
    seed = 7

The protocol (what OpenEnv's own EnvClient does; the HTTP /reset and /step build a fresh environment
on every call, so an episode needs the WebSocket):
- Discovery: GET /schema gives the action's JSON schema. It says how a turn becomes an action:
  "text" fills one string field with the assistant's text (the schema's only required string field,
  or its only string field, or `text_field`); "tool" offers the model one session tool, `tool_name`,
  whose parameters are the action's fields (the base class's `metadata` left out), and takes one call
  to it per turn; "auto" is "text" where a string field can take the text, else "tool", and for an
  MCP environment (its action OpenEnv's CallToolAction: `tool_name`, `arguments`) "mcp": the tools
  its `list_tools` step lists at the episode's start are the session's tools, and a turn's call to
  one is the step `{"type": "call_tool", "tool_name", "arguments"}`, answered with the text of the
  tool's result (its error, if any). A schema that cannot be built from as configured leaves the
  environment BROKEN (ActionNotBuildable).
- SeedSession opens a WebSocket (one per rollout session: the server's environment instance for the
  episode) and sends `reset` with the [reset] table, the row's `verifier_metadata.reset` over it, and
  `episode_id` the rollout's session id unless they name one (OpenEnv's reset takes it; a reset that
  does not is not given it). The observation is the episode's first user message (the prompt; a
  row's `input` may be empty).
- Step: each assistant turn sends `step` with the action built from it. The reward (None: 0, kept as
  `reward` in the step's info), `done` and the observation come back; the observation is the next
  user message (in "tool" mode: the answer to the call), and the whole observation dict, the
  environment's own fields, is the step's `info.observation` in the row. An action the schema
  refuses (arguments that are not a JSON object or do not match the schema, checked here; a
  validation error the server answers; a turn with no call to the tool) is answered to the model as
  an error and steps nothing: `info.action_error` says why, reward 0, the episode goes on. A turn is
  one action: its first call to the tool is it, every other call is answered as not run.
- Verify adds 0 (the steps carry the reward, as NeMo Gym's gymnasium agent sums them) and records
  how the episode ended. CloseSession sends `close` and closes the socket.
- Failures are named, never a reward: no connection EnvServerUnreachable (the socket dropped too), no
  answer EnvServerTimeout, the server at its session limit EnvServerAtCapacity, the environment's
  reset or step raising EnvServerError, an answer that is not an observation (not an object, a reward
  that is not a number, `done` not a boolean, `observation_field` missing) EnvServerBadReply, a
  managed server that restarted under a session EnvSessionLost.

A managed server is a sidecar (foreign.py, launch/sidecar.py) running verifier/bridges/_openenv_server.py
in the OpenEnv interpreter on loopback: BROKEN while down, restarted with backoff, confined as
ROLLMESH_SIDECAR_CONFINE says, stopped with the verifier.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Literal

from rollmesh.launch.sidecar import Sidecar
from rollmesh.mesh import untrusted_json
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.errors import NotJson
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.verifier.bridges.foreign import BridgeConfig
from rollmesh.verifier.bridges.foreign import ForeignServerEnvironment
from rollmesh.verifier.bridges.foreign import folder_of
from rollmesh.verifier.bridges.foreign import sidecar_spec
from rollmesh.verifier.bridges.http_bridge import Json
from rollmesh.verifier.bridges.http_bridge import JsonSocket
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import EnvTurn
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import Seeded
from rollmesh.verifier.environment import Session
from rollmesh.verifier.environment import Task
from rollmesh.verifier.environment import schema_errors
from rollmesh.verifier.environment import seeding_session_id
from rollmesh.verifier.errors import ActionNotBuildable
from rollmesh.verifier.errors import BadTask
from rollmesh.verifier.errors import EnvServerAtCapacity
from rollmesh.verifier.errors import EnvServerBadReply
from rollmesh.verifier.errors import EnvServerError
from rollmesh.verifier.errors import EnvServerUnreachable
from rollmesh.verifier.errors import SessionRequired

log = get_logger("rollmesh.verifier.bridges.openenv_env")

CONFIG_FILE = "openenv.toml"  # marks a folder of this kind (registered in bridges/__init__.py)
LAUNCHER = Path(__file__).with_name("_openenv_server.py")
#: The Action base class's own field: the environment's, never the model's to fill.
ACTION_BASE_FIELDS = frozenset({"metadata"})
ActionMode = Literal["text", "tool", "mcp"]


@dataclass(frozen=True, kw_only=True)
class OpenEnvConfig(BridgeConfig):
    """An environment's openenv.toml."""

    config_file = CONFIG_FILE
    python_var = "ROLLMESH_OPENENV_PYTHON"
    required = ("url", "env_dir", "app")
    required_what = "a server's URL, an OpenEnv environment folder, or an installed environment's app"
    path_keys = ("python", "env_dir")

    url: str = ""
    env_dir: str = ""
    app: str = ""
    action: str = "auto"
    text_field: str = ""
    tool_name: str = "act"
    observation_field: str = ""
    max_sessions: int = 0
    reset: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def checked(cls, raw: dict[str, Any], folder: Path, path: Path) -> dict[str, Any]:
        del folder
        if raw.get("url") and not str(raw["url"]).startswith(("http://", "https://")):
            raise ConfigError(f"{path}: `url` must be an http:// or https:// URL, not {raw['url']!r}")
        if raw.get("action", "auto") not in ("auto", "text", "tool"):
            raise ConfigError(f'{path}: `action` must be "auto", "text" or "tool", not {raw["action"]!r}')
        if not isinstance(raw.get("reset", {}), dict):
            raise ConfigError(f"{path}: [reset] must be a table (reset's keyword arguments)")
        max_sessions = raw.get("max_sessions", 0)
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 0:
            raise ConfigError(f"{path}: `max_sessions` must be a whole number >= 0 (0: no bound)")
        return raw

    @property
    def managed(self) -> bool:
        return not self.url

    @property
    def where(self) -> str:
        return self.url or self.env_dir or self.app

    @property
    def who(self) -> str:
        return f"OpenEnv environment {self.where!r} (managed: no `url`)"


# -- actions -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionPlan:
    """How a turn becomes an action: the model's text in `text_field`, the arguments of a call to
    `tool` (its parameters: the action's schema without the base class's fields), or ("mcp") a call
    to one of the tools an MCP environment lists, as its CallToolAction."""

    mode: ActionMode
    parameters: Json
    text_field: str = ""
    tool: ToolSpec | None = None


def _text_field(parameters: Json) -> str:
    """The field the model's text can fill: the only required field if it is a string, else the only
    string field when none is required ("" when there is no such field)."""
    props = parameters.get("properties") or {}
    strings = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]
    required = list(parameters.get("required") or [])
    if required:
        return required[0] if len(required) == 1 and required[0] in strings else ""
    return strings[0] if len(strings) == 1 else ""


def _is_mcp(props: Json) -> bool:
    """Whether an action's fields are OpenEnv's CallToolAction's (an MCP environment's action)."""
    name, args = props.get("tool_name"), props.get("arguments")
    return (
        isinstance(name, dict)
        and name.get("type") == "string"
        and isinstance(args, dict)
        and (args.get("type") == "object")
    )


def action_plan(schema: Any, cfg: OpenEnvConfig, where: str) -> ActionPlan:
    """The plan for the action `schema` (GET /schema's `action`) as `cfg` asks; ActionNotBuildable,
    naming `where` and the schema's fields, when there is none."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        raise ActionNotBuildable(f"{where}: the action schema is not an object of fields: {schema!r:.200}")
    props = schema.get("properties")
    props = {
        k: v for k, v in (props if isinstance(props, dict) else {}).items() if k not in ACTION_BASE_FIELDS
    }
    required = [r for r in schema.get("required") or [] if r not in ACTION_BASE_FIELDS]
    parameters: Json = {"type": "object", "properties": props, "required": required}
    for key in ("additionalProperties", "$defs"):
        if key in schema:
            parameters[key] = schema[key]
    fields = ", ".join(
        f"{k} ({v.get('type', '?') if isinstance(v, dict) else '?'})" for k, v in props.items()
    )
    if cfg.action == "auto" and _is_mcp(props):
        return ActionPlan("mcp", parameters)
    if cfg.action in ("auto", "text"):
        text = cfg.text_field or _text_field(parameters)
        spec = props.get(text)
        if text and isinstance(spec, dict) and spec.get("type") == "string" and set(required) <= {text}:
            return ActionPlan("text", parameters, text_field=text)
        if cfg.action == "text":
            raise ActionNotBuildable(
                f"{where}: the model's text cannot make an action of this schema "
                f"(fields: {fields or 'none'}; "
                'it needs one string field and no other required one): set `text_field`, or action = "tool"'
            )
    if not props:
        raise ActionNotBuildable(f"{where}: the action schema has no fields a tool call could give")
    description = str(
        schema.get("description") or f"Act in the environment ({schema.get('title', 'action')})."
    )
    return ActionPlan("tool", parameters, tool=ToolSpec.of(cfg.tool_name, description, parameters))


@dataclass(frozen=True)
class Action:
    """A turn made into an action (`value`), or why it could not be (`error`), and the calls of the
    turn it answers: `call_id` the action tool's call, `others` every other call (each answered with
    an error: the environment takes one action per turn)."""

    value: Json | None
    error: str = ""
    call_id: str = ""
    others: tuple[ToolCall, ...] = ()


def turn_action(plan: ActionPlan, turn: Response, listed: Mapping[str, Json] | None = None) -> Action:
    """The action the assistant's turn makes under `plan` (module docstring); `listed`: an MCP
    environment's tools (name -> input schema)."""
    assistant = [m for m in turn.messages if m.role == "assistant"]
    calls = [c for m in assistant for c in m.tool_calls]
    if plan.mode == "text":
        text = assistant[-1].content if assistant else ""
        return Action({plan.text_field: text}, others=tuple(calls))
    offered = {plan.tool.name: plan.parameters} if plan.tool is not None else dict(listed or {})
    call = next((c for c in calls if c.name in offered), None)
    others = tuple(c for c in calls if c is not call)
    if call is None:
        if plan.tool is not None:
            return Action(None, f"call the tool `{plan.tool.name}` with the action's fields", others=others)
        names = ", ".join(f"`{n}`" for n in offered) or "none listed"
        return Action(None, f"call one of the environment's tools ({names})", others=others)
    try:
        args = untrusted_json.loads(call.arguments_json) if call.arguments_json.strip() else {}
    except NotJson as exc:
        return Action(None, f"the arguments are not JSON: {exc}", call.id, others)
    if not isinstance(args, dict):
        return Action(None, "the arguments must be a JSON object of the action's fields", call.id, others)
    if problems := schema_errors(args, offered[call.name]):
        return Action(None, "; ".join(problems), call.id, others)
    if plan.mode == "mcp":
        return Action({"type": "call_tool", "tool_name": call.name, "arguments": args}, "", call.id, others)
    return Action(args, call_id=call.id, others=others)


def listed_tools(observation: Json, where: str) -> dict[str, ToolSpec]:
    """The tools an MCP environment's ListToolsObservation lists; EnvServerBadReply when it lists none
    readable."""
    tools = observation.get("tools")
    if not isinstance(tools, list):
        raise EnvServerBadReply(f"{where}: list_tools answered no `tools` list: {observation!r:.200}")
    out: dict[str, ToolSpec] = {}
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not name:
            raise EnvServerBadReply(f"{where}: list_tools listed a tool without a name: {tool!r:.120}")
        schema = tool.get("input_schema", tool.get("inputSchema"))
        params = schema if isinstance(schema, dict) else {"type": "object", "properties": {}}
        out[name] = ToolSpec.of(name, str(tool.get("description") or ""), params)
    return out


# -- observations ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """One reset or step answer, checked: the observation's fields, the raw reward, done."""

    observation: Json
    reward: float | None
    done: bool

    def text(self, field_name: str, where: str) -> str:
        """The observation as message text: `field_name`'s string, or the whole observation as JSON."""
        if not field_name:
            return json.dumps(self.observation, ensure_ascii=False)
        value = self.observation.get(field_name)
        if not isinstance(value, str):
            raise EnvServerBadReply(
                f"{where}: the observation's `{field_name}` is {type(value).__name__}, not text "
                f"(fields: {', '.join(self.observation) or 'none'})"
            )
        return value


def observed(data: Any, where: str) -> Observed:
    """A reset or step answer's `data` as an `Observed`; EnvServerBadReply when it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("observation"), dict):
        raise EnvServerBadReply(f"{where} answered no observation object: {data!r:.200}")
    reward, done = data.get("reward"), data.get("done", False)
    if reward is not None and not isinstance(reward, (bool, int, float)):
        raise EnvServerBadReply(f"{where} answered reward = {reward!r:.80}, not a number")
    if not isinstance(done, bool):
        raise EnvServerBadReply(f"{where} answered done = {done!r:.80}, not a boolean")
    return Observed(data["observation"], None if reward is None else float(reward), done)


def mcp_text(observation: Json) -> str:
    """A CallToolObservation as the call's answer: the tool's error, else the text of its result's
    content (MCP's answer for the model), else the observation as JSON."""
    error = observation.get("error")
    if error:
        return json.dumps({"error": error}, ensure_ascii=False)
    result = observation.get("result")
    content = result.get("content") if isinstance(result, dict) else None
    texts = [c["text"] for c in content or () if isinstance(c, dict) and isinstance(c.get("text"), str)]
    return "\n".join(texts) if texts else json.dumps(observation, ensure_ascii=False)


# -- the environment ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Episode:
    """A rollout session's episode: its WebSocket, the server incarnation that opened it, how it ended."""

    socket: JsonSocket
    incarnation: int
    #: An MCP environment's tools, as its list_tools answered at the episode's start (name -> schema).
    tools: dict[str, Json] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    steps: int = 0
    done: bool = False
    released: bool = False


class OpenEnvEnvironment(ForeignServerEnvironment):
    """An OpenEnv environment server behind the Environment API (see the module docstring)."""

    def __init__(self, context: EnvContext) -> None:
        super().__init__(context)
        folder = folder_of(context, "an OpenEnv environment", CONFIG_FILE)
        self.cfg = OpenEnvConfig.load(folder)
        self.label = f"OpenEnv environment {context.name!r}"
        sidecar: Sidecar | None = None
        if self.cfg.managed:
            sidecar = Sidecar(
                sidecar_spec(
                    tag=f"openenv-{context.name}",
                    name=f"{self.label} server ({self.cfg.where})",
                    argv=(self.cfg.interpreter(), str(LAUNCHER)),
                    env={
                        "ROLLMESH_OPENENV_APP": json.dumps({"env_dir": self.cfg.env_dir, "app": self.cfg.app})
                    },
                    probe=self._probe,
                    start_timeout_s=self.cfg.start_timeout_s,
                    readable=[str(folder), *filter(None, (self.cfg.env_dir,))],
                )
            )
        self.attach(self.label, self.cfg.url, self.cfg.timeout_s, sidecar)
        self.plan: ActionPlan | None = None
        self._broken = ""
        self._slots = asyncio.Semaphore(self.cfg.max_sessions) if self.cfg.max_sessions else None
        #: Seeds waiting for one of the `max_sessions` episodes to close.
        self.waiting = 0
        self._episodes: set[Episode] = set()

    async def _probe(self, address: str) -> bool:
        del address
        return await self.http.probe("/health")

    # -- lifecycle ------------------------------------------------------------------------------------

    def discovered(self) -> bool:
        return self.plan is not None or bool(self._broken)

    async def discover(self) -> None:
        """Read the action schema (GET /schema) and make the plan for it."""
        reply = await self.http.get("/schema")
        if not reply.ok:
            raise EnvServerError(f"{self.label}: GET /schema answered {reply.status}: {reply.text[:200]}")
        schema = self.http.json_object(reply, "GET /schema").get("action")
        try:
            self.plan = action_plan(schema, self.cfg, self.label)
        except ActionNotBuildable as exc:
            self._broken = exc.message
            log.warning("openenv_action_not_buildable", environment=self.context.name, error=exc.message)
            return
        log.info(
            "openenv_environment_ready",
            environment=self.context.name,
            url=self.base_url(),
            action=self.plan.mode,
            field=self.plan.text_field or (self.plan.tool.name if self.plan.tool else ""),
        )

    async def aclose(self) -> None:
        for episode in list(self._episodes):
            await self._release(episode)
        await super().aclose()

    def problem(self) -> str:
        return self._broken or super().problem()

    def summary(self) -> str:
        mode = f"{self.cfg.where}, {self.managed_by()}" if self.sidecar is not None else self.cfg.url
        return self.cfg.description or f"OpenEnv environment server, {mode}"

    def takes_turns(self) -> bool:
        return True

    def _plan(self) -> ActionPlan:
        if self._broken:
            raise ActionNotBuildable(self._broken)
        if self.plan is None:
            raise EnvServerError(f"{self.label}: its action schema was never read (GET /schema)")
        return self.plan

    # -- the episode ----------------------------------------------------------------------------------

    async def seed_session(self, task: Task) -> Seeded:
        if not self.discovered():
            await self.discover()
        plan = self._plan()
        reset = dict(self.cfg.reset)
        row_reset = task.metadata.get("reset")
        if row_reset is not None and not isinstance(row_reset, dict):
            raise BadTask(
                f"{self.label}: the row's verifier_metadata.reset must be an object (reset's arguments)"
            )
        reset |= row_reset or {}
        if seeding_session_id():  # the episode named after its rollout (`<job>/<task>/<rollout>`)
            reset.setdefault("episode_id", seeding_session_id())
        if self._slots is not None:
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        try:
            socket = await self.http.websocket("/ws")
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        episode = Episode(socket, self.server_incarnation())
        self._episodes.add(episode)
        try:
            first = await self._call(episode, {"type": "reset", "data": reset}, "reset")
        except BaseException:
            await self._release(episode)
            raise
        opening = (Message("user", first.text(self.cfg.observation_field, f"{self.label} reset")),)
        tools: tuple[ToolSpec, ...] = (plan.tool,) if plan.tool is not None else ()
        if plan.mode == "mcp":
            try:
                listed = await self._call(
                    episode, {"type": "step", "data": {"type": "list_tools"}}, "list_tools"
                )
            except BaseException:
                await self._release(episode)
                raise
            specs = listed_tools(listed.observation, self.label)
            episode.tools = {name: json.loads(spec.parameters_json) for name, spec in specs.items()}
            tools = tuple(specs.values())
        return Seeded(episode, opening, tools)

    async def _call(self, episode: Episode, message: Json, what: str) -> Observed:
        """One reset or step on the episode's socket, its answer checked (module docstring)."""
        answer = await episode.socket.call(message, f"{what} (WebSocket /ws)")
        kind, data = answer.get("type"), answer.get("data")
        if kind == "observation":
            return observed(data, f"{self.label} {what}")
        if kind == "error":
            error = data if isinstance(data, dict) else {}
            code, text = str(error.get("code", "")), " ".join(str(error.get("message", "")).split())[:300]
            if code == "CAPACITY_REACHED":
                raise EnvServerAtCapacity(
                    f"{self.label}: the server holds as many sessions as it allows ({text}): set "
                    "max_sessions in openenv.toml to its max_concurrent_envs"
                )
            if code == "VALIDATION_ERROR" and what == "step":
                raise _Refused(json.dumps(error.get("errors", text), ensure_ascii=False)[:500])
            raise EnvServerError(f"{self.label}: {what} failed on the server ({code or 'no code'}): {text}")
        raise EnvServerBadReply(f"{self.label}: {what} answered a message of type {kind!r:.40}")

    async def step(self, session: Session, turn: Response) -> EnvTurn:
        episode = self.session_state(session, Episode)
        plan = self._plan()
        action = turn_action(plan, turn, episode.tools)
        refused = action.error
        result: Observed | None = None
        if action.value is not None:
            async with episode.lock:
                try:
                    result = await self._call(episode, {"type": "step", "data": action.value}, "step")
                except _Refused as exc:
                    refused = f"the environment refused the action: {exc}"
                except (EnvServerError, EnvServerUnreachable):
                    self.session_state(session, Episode)  # a restart under the call: EnvSessionLost
                    raise
            episode.steps += 1
        offered = {plan.tool.name} if plan.tool is not None else set(episode.tools)
        messages = [Message("tool", _unrun(call, offered), tool_call_id=call.id) for call in action.others]
        if result is None:
            note = f"No action was taken: {refused}."
            if action.call_id:
                messages.insert(0, Message("tool", json.dumps({"error": note}), tool_call_id=action.call_id))
            else:
                messages.append(Message("user", note))
            return EnvTurn(tuple(messages), 0.0, False, {"action_error": refused})
        episode.done = result.done
        if plan.mode == "mcp" and not self.cfg.observation_field:
            text = mcp_text(result.observation)
        else:
            text = result.text(self.cfg.observation_field, f"{self.label} step")
        if action.call_id:
            messages.insert(0, Message("tool", text, tool_call_id=action.call_id))
        elif not result.done:
            messages.append(Message("user", text))
        info = {"observation": result.observation, "reward": result.reward}
        return EnvTurn(tuple(messages), result.reward or 0.0, result.done, info)

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        del task, response
        if session is None:
            raise SessionRequired(f"{self.label}: an episode is scored by its steps, replayed in a session")
        episode = self.session_state(session, Episode)
        return VerifyResult(0.0, details={"done": episode.done, "steps": episode.steps})

    async def close_session(self, session: Session) -> None:
        if isinstance(session.state, Episode):
            await self._release(session.state)

    async def _release(self, episode: Episode) -> None:
        if episode.released:
            return
        episode.released = True
        self._episodes.discard(episode)
        await episode.socket.send({"type": "close"})
        await episode.socket.aclose()
        if self._slots is not None:
            self._slots.release()


def _unrun(call: ToolCall, offered: set[str]) -> str:
    """The answer to a call the turn's action is not: every call of a turn has an answer."""
    if call.name in offered:
        return json.dumps({"error": f"not run: `{call.name}` takes one action per turn"})
    return json.dumps({"error": f"no tool named {call.name[:64]!r}"})


class _Refused(Exception):
    """The server's validation error for a step's action (answered to the model, not raised on)."""
