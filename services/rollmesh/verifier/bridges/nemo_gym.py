"""A NeMo Gym environment: an `Environment` whose session, tools and verdict are served by a real
NeMo Gym resources server over its own HTTP protocol (the bridge; no port to env.py needed).

Declared as `environments/<name>/nemo_gym.toml` in any artifact root (no env.py):

    server = "example_session_state_mgmt"   # the resources server (resources_servers/<server>)
    url = "http://127.0.0.1:8000"           # attach: a server the user runs (any NeMo Gym version)
    # or managed (no url): the verifier starts it from a NeMo Gym installation and supervises it
    python = "/opt/gym-venv/bin/python"     # its interpreter (or venv = "/opt/gym-venv"; default
                                            # ROLLMESH_NEMO_GYM_PYTHON)
    server_dir = ""                         # a server folder of the user's own instead of the
                                            # installation's resources_servers/<server>
    config = ""                             # its NeMo Gym YAML (default configs/<server>.yaml)
    instance = ""                           # that YAML's top-level key (default: the first)
    timeout_s = 30                          # per HTTP call
    tool_calls_are_answer = false           # true: calls are the answer, never run (NeMo Gym's
                                            # non_executing_simple_agent: xlam_fc)
    [overrides]                             # server config fields over the YAML's
    should_use_judge = false

The protocol (what NeMo Gym's simple_agent does, plus 0.7.0's additions):
- SeedSession: POST /seed_session with the whole row (null fields of `responses_create_params`
  dropped: the servers' strict request models refuse them with 422). The server's signed session
  cookie is kept for the rollout's session and sent on every later call (http_bridge.py).
- CallTool: POST /<tool name> with the call's JSON arguments; the body text is the tool result
  whatever the status (an error status marks it an error). Arguments that are not a JSON object,
  and names that are not a plain route segment or name one of the protocol's own routes, are
  answered as error results without a call, as simple_agent answers bad arguments.
- Verify: POST /verify with the row plus `response`, an OpenAI Responses object built from the
  rollout (mesh/responses_items.py). The reply's `reward` is the reward, `reward_components` the
  components, `extracted_answer` the extracted answer, `mask_sample` (NeMo Gym >= 0.7: the server
  could not judge, a failed judge) marks the verdict masked; every other field it adds (`mask_sample`,
  `failure_kind`, `failure_reason`, metrics) goes to `details`.
- CloseSession: POST /close_session (NeMo Gym >= 0.7) when the server's OpenAPI lists it.
- A Verify without a session (`rollmesh reverify`) replays the rollout on a fresh session: seed,
  every tool call the rollout executed (those with a recorded output), verify, close. A server
  answering GET /reverify_mode "stateless" is verified without the replay, "unsupported" refuses
  (ReverifyUnsupported).
- Gymnasium-style servers (routes /reset and /step, NeMo Gym's gymnasium_agent) take environment
  turns: SeedSession is POST /reset with the row (its observation is the episode's first user
  message); each assistant turn is POST /step with the row and that turn as a Responses object; the
  step's reward, `terminated or truncated` as done, `info.tool_outputs` as tool results and the
  observation as the next user message go back to the loop. Such a server has no /verify: the
  rollout's reward is its steps' sum (verify adds 0 and records how the episode ended), as the
  gymnasium agent computes it; a session-less verify replays reset and a step per assistant turn.
- Episode servers (routes /step and /close, no /reset: aviary, toolsandbox; their rows have an empty
  `input`) also take environment turns, keyed by the `env_id` their /seed_session answers: its `obs`
  (Responses input items) is the episode's first observation and its `tools` the session's tools.
  Each assistant turn is POST /step with `env_id` and the turn's function calls (as `action`, the
  aviary shape, and `function_calls` plus `text`, the toolsandbox shape); the answer's `obs` (tool
  outputs, user messages) goes back to the loop and `done` ends the episode. The rollout's reward is
  POST /verify's after POST /close (the server scores there: aviary sums its steps' rewards,
  toolsandbox scores at /close), as NeMo Gym's aviary agent takes it: a step's own reward is
  recorded in its info (`step_reward`), not added again. A session-less verify replays seed and a
  step per assistant turn.
- Failures are named, never a reward: 5xx on seed/verify EnvServerError, not JSON or no numeric
  reward EnvServerBadReply, 422 BadTask (the row does not fit the server), no answer
  EnvServerTimeout, no connection EnvServerUnreachable; a managed server that restarted under a
  seeded session EnvSessionLost (its state is gone: the rollout is retried from its seed).

Attach modes and isolation: a URL-attached server is whatever the user runs (its isolation is
theirs); one that is down when the verifier starts is BROKEN and probed with backoff until it
answers (then its tools are listed). A managed server is a sidecar (launch/sidecar.py) running
verifier/bridges/_nemo_gym_server.py in the named interpreter on loopback: BROKEN in ListEnvironments while
it is down, restarted with backoff, stopped with the verifier; it runs as the verifier's user, with
the verifier's network.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh.launch.sidecar import Sidecar
from rollmesh.launch.sidecar import SidecarSpec
from rollmesh.mesh import responses_items
from rollmesh.mesh import untrusted_json
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.errors import NotJson
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.responses_items import items_from_messages
from rollmesh.mesh.responses_items import response_object
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.verifier.bridges.foreign import BridgeConfig
from rollmesh.verifier.bridges.foreign import ForeignServerEnvironment
from rollmesh.verifier.bridges.foreign import folder_of
from rollmesh.verifier.bridges.foreign import numbers_of
from rollmesh.verifier.bridges.foreign import reward_of
from rollmesh.verifier.bridges.foreign import sidecar_spec
from rollmesh.verifier.bridges.http_bridge import Cookies
from rollmesh.verifier.bridges.http_bridge import Json
from rollmesh.verifier.bridges.http_bridge import Reply
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import EnvTurn
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import Seeded
from rollmesh.verifier.environment import Session
from rollmesh.verifier.environment import Task
from rollmesh.verifier.environment import ToolCall
from rollmesh.verifier.environment import ToolOutput
from rollmesh.verifier.errors import BadTask
from rollmesh.verifier.errors import EnvServerBadReply
from rollmesh.verifier.errors import EnvServerError
from rollmesh.verifier.errors import EnvSessionLost
from rollmesh.verifier.errors import ReverifyUnsupported

log = get_logger("rollmesh.verifier.bridges.nemo_gym")

CONFIG_FILE = "nemo_gym.toml"  # marks a folder of this kind (registered in bridges/__init__.py)
LAUNCHER = Path(__file__).with_name("_nemo_gym_server.py")
#: The protocol's own routes: never called as a tool.
PROTOCOL_ROUTES = frozenset(
    {
        "seed_session",
        "verify",
        "close_session",
        "aggregate_metrics",
        "reverify_mode",
        "reset",
        "step",
        "openapi.json",
        "docs",
    }
)
_ROUTE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_RESULT_FIELDS = frozenset({"reward", "reward_components", "extracted_answer"})
_VERDICT_FIELDS = frozenset({"reward", "mask_sample", "failure_kind", "failure_reason", "response"})


@dataclass(frozen=True, kw_only=True)
class NemoGymConfig(BridgeConfig):
    """An environment's nemo_gym.toml."""

    config_file = CONFIG_FILE
    python_var = "ROLLMESH_NEMO_GYM_PYTHON"
    required = "server"
    required_what = "the resources server's name"
    path_keys = ("python", "server_dir")

    server: str
    url: str = ""
    server_dir: str = ""
    config: str = ""
    instance: str = ""
    timeout_s: float = 30.0
    #: The model's tool calls are its answer, never run (rows NeMo Gym serves with its
    #: non_executing_simple_agent: xlam_fc, structured_outputs v4).
    tool_calls_are_answer: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def managed(self) -> bool:
        return not self.url

    @property
    def who(self) -> str:
        return f"NeMo Gym server {self.server!r} (managed: no `url`)"


@dataclass
class BridgeState:
    """A rollout session on the server: its cookies, and the server incarnation that seeded it."""

    cookies: Cookies
    incarnation: int
    #: A gymnasium episode's last step answer (how it ended), recorded by verify.
    last_step: Json = field(default_factory=dict)
    #: An episode server's id of this session's episode (its /seed_session answer's `env_id`).
    env_id: str = ""
    closed: bool = False


def drop_nulls(value: Any) -> Any:
    """`value` without null object fields, recursively (tool parameter schemas kept as they are)."""
    if isinstance(value, dict):
        return {
            k: (v if k in ("tools", "parameters") else drop_nulls(v))
            for k, v in value.items()
            if v is not None
        }
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value


def row_body(row: Mapping[str, Any]) -> Json:
    """The row as NeMo Gym's servers take it: `responses_create_params` without null fields, and
    without a verdict a stored rollout carries (`reward`, `mask_sample`, `failure_*`): servers
    that echo their request into their reply (`Reply(**body.model_dump(), reward=...)`) fail on it."""
    body = {k: v for k, v in row.items() if k not in _VERDICT_FIELDS}
    params = body.get("responses_create_params")
    if isinstance(params, dict):
        body["responses_create_params"] = drop_nulls(params)
    return body


def responses_object(row: Mapping[str, Any], response: Response) -> Json:
    """The rollout as the OpenAI Responses object NeMo Gym's verify reads (mesh/responses_items.py),
    with the row's tools and tool choice."""
    params = row.get("responses_create_params")
    params = params if isinstance(params, Mapping) else {}
    obj = response_object(
        items_from_messages(response.messages),
        response_id=f"resp_{uuid.uuid4().hex}",
        model=str(params.get("model") or "rollmesh"),
        finish_reason="stop",
        created_at=time.time(),
    )
    obj["parallel_tool_calls"] = bool(params.get("parallel_tool_calls", True))
    obj["tool_choice"] = params.get("tool_choice") or "auto"
    obj["tools"] = list(params.get("tools") or [])
    return obj


def verify_result(reply: Json, sent: Mapping[str, Any], where: str) -> VerifyResult:
    """A verify reply as a VerifyResult; EnvServerBadReply when it has no numeric `reward`."""
    reward = reward_of(reply, where, "/verify")
    components = numbers_of(reply.get("reward_components"))
    answer = reply.get("extracted_answer")
    extracted = (
        ""
        if answer is None
        else answer
        if isinstance(answer, str)
        else json.dumps(answer, ensure_ascii=False)
    )
    details = {k: v for k, v in reply.items() if k not in sent and k not in _RESULT_FIELDS}
    return VerifyResult(reward, components, extracted, details, masked=reply.get("mask_sample") is True)


def _ending(step: Json) -> Json:
    """How a gymnasium episode ended, for the verdict's details."""
    return {k: step[k] for k in ("terminated", "truncated") if k in step}


def openapi_tools(spec: Json) -> list[ToolSpec]:
    """The tool routes an OpenAPI document lists (POST, one plain path segment, not the protocol's)."""
    components = (
        spec.get("components", {}).get("schemas", {}) if isinstance(spec.get("components"), dict) else {}
    )

    def resolve(schema: Any, depth: int = 0) -> Any:
        if isinstance(schema, dict):
            ref = schema.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/") and depth < 20:
                return resolve(components.get(ref.rsplit("/", 1)[1], {}), depth + 1)
            return {k: resolve(v, depth + 1) for k, v in schema.items()}
        if isinstance(schema, list):
            return [resolve(v, depth + 1) for v in schema]
        return schema

    tools: list[ToolSpec] = []
    paths = spec.get("paths")
    for path, ops in (paths if isinstance(paths, dict) else {}).items():
        name = str(path).strip("/")
        post = ops.get("post") if isinstance(ops, dict) else None
        if not isinstance(post, dict) or not _ROUTE.fullmatch(name) or name in PROTOCOL_ROUTES:
            continue
        body = post.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        params = resolve(body) if isinstance(body, dict) else {"type": "object", "properties": {}}
        if isinstance(params, dict):
            params.pop("title", None)
        tools.append(ToolSpec.of(name, str(post.get("description") or post.get("summary") or ""), params))
    return sorted(tools, key=lambda t: t.name)


class NemoGymEnvironment(ForeignServerEnvironment):
    """A NeMo Gym resources server behind the Environment API (see the module docstring)."""

    def __init__(self, context: EnvContext) -> None:
        super().__init__(context)
        self.cfg = NemoGymConfig.load(folder_of(context, "a NeMo Gym environment", CONFIG_FILE))
        sidecar = Sidecar(self._sidecar_spec(self.cfg.interpreter())) if self.cfg.managed else None
        self.attach(f"NeMo Gym server {self.cfg.server!r}", self.cfg.url, self.cfg.timeout_s, sidecar)
        self._route_tools: list[ToolSpec] = []
        self._routes: set[str] = set()
        self._reverify_mode = "unknown"
        self._discovered = False
        self._gymnasium = False
        self._episodes = False

    def _sidecar_spec(self, python: str) -> SidecarSpec:
        job = {k: getattr(self.cfg, k) for k in ("server", "server_dir", "config", "instance", "overrides")}
        return sidecar_spec(
            tag=f"nemo-gym-{self.context.name}",
            name=f"NeMo Gym server {self.cfg.server!r} (environment {self.context.name!r})",
            argv=(python, str(LAUNCHER)),
            env={"ROLLMESH_NEMO_GYM_SERVER": json.dumps(job)},
            probe=self._probe,
            start_timeout_s=self.cfg.start_timeout_s,
            readable=[str(self.context.path), *filter(None, (self.cfg.server_dir, self.cfg.config))],
        )

    async def _probe(self, address: str) -> bool:
        del address
        return await self.http.probe("/")

    # -- lifecycle ------------------------------------------------------------------------------------

    def discovered(self) -> bool:
        return self._discovered

    async def discover(self) -> None:
        """Read the server's routes (OpenAPI): its tools, /close_session, /reverify_mode."""
        spec: Any = {}
        for attempt in range(3):  # a server can answer its first /openapi.json badly while it warms up
            reply = await self.http.get("/openapi.json")
            problem = ""
            try:
                spec = untrusted_json.loads(reply.text) if reply.ok else None
            except NotJson as exc:
                spec, problem = None, str(exc)
            if isinstance(spec, dict):
                break
            log.warning(
                "nemo_gym_openapi_unreadable",
                environment=self.context.name,
                status=reply.status,
                attempt=attempt,
                problem=problem or reply.text[:120],
            )
            await asyncio.sleep(0.5)
        # An OpenAPI not read (a server still warming up) is read again at the next seed: without it
        # the server's tools, /close_session and its gymnasium or episode routes are unknown.
        self._discovered = isinstance(spec, dict)
        if isinstance(spec, dict):
            self._route_tools = openapi_tools(spec)
            paths = spec.get("paths")
            self._routes = {str(p).strip("/") for p in paths} if isinstance(paths, dict) else set()
        self._gymnasium = {"reset", "step"} <= self._routes
        self._episodes = {"step", "close"} <= self._routes and not self._gymnasium
        if "reverify_mode" in self._routes:
            mode = await self.http.get("/reverify_mode")
            try:
                value = untrusted_json.loads(mode.text) if mode.ok else ""
            except NotJson:
                value = ""
            self._reverify_mode = value if isinstance(value, str) and value else "unknown"
        log.info(
            "nemo_gym_environment_ready",
            environment=self.context.name,
            server=self.cfg.server,
            url=self.base_url(),
            tools=len(self._route_tools),
            reverify_mode=self._reverify_mode,
            gymnasium=self._gymnasium,
            episodes=self._episodes,
        )

    def listed_tools(self) -> list[ToolSpec]:
        # An episode server's /close is its protocol's (module doc), never the model's tool.
        return [t for t in self._route_tools if not (self._episodes and t.name == "close")]

    def summary(self) -> str:
        mode = self.managed_by() or self.cfg.url
        return self.cfg.description or f"NeMo Gym resources server {self.cfg.server!r}, {mode}"

    def takes_turns(self) -> bool:
        return self._gymnasium or self._episodes

    def tool_calls_are_answer(self) -> bool:
        return self.cfg.tool_calls_are_answer

    def _state(self, session: Session) -> BridgeState:
        return self.session_state(session, BridgeState)

    # -- the protocol ---------------------------------------------------------------------------------

    def _expect_ok(self, reply: Reply, what: str) -> None:
        if reply.ok:
            return
        text = " ".join(reply.text.split())[:300]
        if reply.status == 422:
            raise BadTask(f"NeMo Gym server {self.cfg.server!r} refused the row at {what} (422): {text}")
        raise EnvServerError(
            f"NeMo Gym server {self.cfg.server!r}: {what} answered {reply.status}: {text}",
            metadata={"http_status": str(reply.status)},
        )

    async def seed_session(self, task: Task) -> BridgeState | Seeded:
        state, first, tools = await self._open(task)
        return Seeded(state, first, tools) if self.takes_turns() else state

    async def _open(self, task: Task) -> tuple[BridgeState, tuple[Message, ...], tuple[ToolSpec, ...]]:
        """A new session on the server (/seed_session, or /reset): its first observation and the
        session's own tools too, where the server gives them."""
        if not self._discovered:
            await self.discover()
        state = BridgeState(Cookies(), self.server_incarnation())
        where = f"NeMo Gym server {self.cfg.server!r}"
        if not self._gymnasium:
            reply = await self.http.post("/seed_session", row_body(task.row), state.cookies)
            self._expect_ok(reply, "/seed_session")
            if not self._episodes:
                return state, (), ()
            seeded = self.http.json_object(reply, f"{where} /seed_session")
            env_id = seeded.get("env_id")
            if not isinstance(env_id, str) or not env_id:
                raise EnvServerBadReply(
                    f"{where}: /seed_session answered no `env_id` (it has /step and /close)"
                )
            state.env_id = env_id
            first = self._items(seeded.get("obs"), f"{where} /seed_session `obs`")
            return state, tuple(first), tuple(self._session_tools(seeded.get("tools"), where))
        reply = await self.http.post("/reset", row_body(task.row), state.cookies)
        self._expect_ok(reply, "/reset")
        observation = self.http.json_object(reply, f"NeMo Gym server {self.cfg.server!r} /reset").get(
            "observation"
        )
        return state, ((Message("user", str(observation)),) if observation else ()), ()

    @staticmethod
    def _items(value: Any, where: str) -> list[Message]:
        """Responses input items an episode server answered (tool outputs, messages) as messages."""
        if value is None:
            return []
        if not isinstance(value, list):
            raise EnvServerBadReply(f"{where} is not a list of items")
        try:
            return responses_items.messages_from_items(value, default_role="user")
        except responses_items.NotResponsesItem as exc:
            raise EnvServerBadReply(f"{where}: {exc}") from None

    @staticmethod
    def _session_tools(value: Any, where: str) -> list[ToolSpec]:
        """The function tools a /seed_session answer lists (Responses FunctionToolParam)."""
        tools: list[ToolSpec] = []
        for tool in value if isinstance(value, list) else []:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str) or not name:
                raise EnvServerBadReply(f"{where}: /seed_session listed a tool without a name")
            params = tool.get("parameters")
            tools.append(
                ToolSpec.of(
                    name,
                    str(tool.get("description") or ""),
                    params if isinstance(params, dict) else {"type": "object", "properties": {}},
                )
            )
        return tools

    async def step(self, session: Session, turn: Response) -> EnvTurn:
        state = self._state(session)
        if self._episodes:
            return await self._episode_step(turn, state, session)
        answer = await self._step(session.task, turn, state)
        state.last_step = answer
        self._state(session)
        done = bool(answer.get("terminated")) or bool(answer.get("truncated"))
        messages: list[Message] = []
        info = answer.get("info") if isinstance(answer.get("info"), dict) else {}
        if not done:
            outputs = info.get("tool_outputs") if isinstance(info, dict) else None
            for out in outputs if isinstance(outputs, list) else []:
                if isinstance(out, dict):
                    messages.append(
                        Message("tool", str(out.get("output", "")), tool_call_id=str(out.get("call_id", "")))
                    )
            if answer.get("observation"):
                messages.append(Message("user", str(answer["observation"])))
        return EnvTurn(tuple(messages), float(answer["reward"]), done, dict(info or {}))

    async def _step(self, task: Task, turn: Response, state: BridgeState) -> Json:
        """POST /step with the row and the turn's assistant output; the answer, checked."""
        body = row_body(task.row)
        body["response"] = responses_object(
            task.row, Response(tuple(m for m in turn.messages if m.role == "assistant"))
        )
        reply = await self.http.post("/step", body, state.cookies)
        self._expect_ok(reply, "/step")
        answer = self.http.json_object(reply, f"NeMo Gym server {self.cfg.server!r} /step")
        reward = answer.get("reward", 0.0)
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise EnvServerBadReply(
                f"NeMo Gym server {self.cfg.server!r}: /step answered reward = {reward!r:.80}"
            )
        return answer | {"reward": float(reward)}

    async def _episode_step(self, turn: Response, state: BridgeState, session: Session | None) -> EnvTurn:
        """POST /step of an episode server: the turn's calls (both request shapes, module doc)."""
        where = f"NeMo Gym server {self.cfg.server!r} /step"
        assistant = [m for m in turn.messages if m.role == "assistant"]
        items = responses_items.items_from_messages(assistant)
        calls = [i for i in items if i.get("type") == "function_call"]
        text = "\n".join(m.content for m in assistant if m.content) or None
        body = {"env_id": state.env_id, "action": calls, "function_calls": calls, "text": text}
        reply = await self.http.post("/step", body, state.cookies)
        if session is not None:
            self._state(session)
        self._expect_ok(reply, "/step")
        answer = self.http.json_object(reply, where)
        reward, done = answer.get("reward", 0.0), answer.get("done")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not isinstance(done, bool):
            raise EnvServerBadReply(f"{where} answered reward = {reward!r:.40}, done = {done!r:.40}")
        messages = self._items(answer.get("obs"), f"{where} `obs`")
        if any(m.role == "assistant" for m in messages):
            raise EnvServerBadReply(f"{where} answered an assistant message: the policy did not write it")
        # The server scores the episode at /verify (module doc): the step's reward is recorded only.
        return EnvTurn(tuple(messages), 0.0, done, {"step_reward": float(reward)})

    async def _episode_verdict(self, task: Task, response: Response, state: BridgeState) -> VerifyResult:
        """An episode server's verdict: POST /close (it scores there), then /verify with its env_id."""
        await self._close_episode(state)
        body = row_body(task.row)
        body["response"] = responses_object(task.row, response) | {
            "env_id": state.env_id,
            "group_id": str(task.row.get("task_idx", state.env_id)),  # as the aviary agent sets it
            "contains_transitions": False,
        }
        reply = await self.http.post("/verify", body, state.cookies)
        self._expect_ok(reply, "/verify")
        where = f"NeMo Gym server {self.cfg.server!r}"
        return verify_result(self.http.json_object(reply, f"{where} /verify"), body, where)

    async def _close_episode(self, state: BridgeState) -> None:
        if state.closed or not state.env_id:
            return
        state.closed = True
        reply = await self.http.post("/close", {"env_id": state.env_id}, state.cookies)
        if not reply.ok:
            log.debug("nemo_gym_episode_close_failed", env_id=state.env_id, status=reply.status)

    async def call_tool(self, session: Session, call: ToolCall) -> ToolOutput:
        state = self._state(session)
        if not _ROUTE.fullmatch(call.name) or call.name in PROTOCOL_ROUTES:
            return ToolOutput(call.id, json.dumps({"error": f"no tool named {call.name[:64]!r}"}), True)
        try:
            args = untrusted_json.loads(call.arguments_json) if call.arguments_json.strip() else {}
        except NotJson as exc:
            return ToolOutput(call.id, json.dumps({"error": f"Invalid tool call arguments: {exc}"}), True)
        reply = await self.http.post(f"/{call.name}", args, state.cookies)
        self._state(session)  # the server may have restarted under this very call
        return ToolOutput(call.id, reply.text, not reply.ok)

    async def close_session(self, session: Session) -> None:
        state = session.state
        if isinstance(state, BridgeState) and self._episodes:
            await self._close_episode(state)
        if "close_session" not in self._routes or not isinstance(state, BridgeState):
            return
        rid = re.sub(r"[^A-Za-z0-9._-]", "-", session.id).strip("-.") or "rollout"
        body = {"resources_session_id": rid, "episode_id": {"rollout_id": rid, "attempt": 0}}
        reply = await self.http.post("/close_session", body, state.cookies)
        if not reply.ok:
            log.debug(
                "nemo_gym_close_failed", session_id=session.id, status=reply.status, body=reply.text[:200]
            )

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        if self._episodes:
            if session is not None:
                verdict = await self._episode_verdict(task, response, self._state(session))
                self._state(session)  # a verdict from a server that restarted under the call is no verdict
                return verdict
            return await self._replay_episode_server(task, response)
        if self._gymnasium:
            if session is None:
                return await self._replay_episode(task, response)
            last = self._state(session).last_step
            return VerifyResult(0.0, details=_ending(last))
        if session is not None:
            result = await self._verify(task, response, self._state(session).cookies)
            self._state(session)  # the server may have restarted under this very call
            return result
        return await self._reverify(task, response)

    async def _replay_episode_server(self, task: Task, response: Response) -> VerifyResult:
        """A stored episode of an episode server: seed, a step per assistant turn until done, verify."""
        state, _, _ = await self._open(task)
        for message in response.messages:
            if (
                message.role == "assistant"
                and (await self._episode_step(Response((message,)), state, None)).done
            ):
                break
        if state.incarnation != self.server_incarnation():
            raise EnvSessionLost(f"NeMo Gym server {self.cfg.server!r} restarted during a replay")
        return await self._episode_verdict(task, response, state)

    async def _replay_episode(self, task: Task, response: Response) -> VerifyResult:
        """A stored gymnasium episode: reset, then a step per assistant turn until done; the steps' sum."""
        state, _, _ = await self._open(task)
        total = 0.0
        for message in response.messages:
            if message.role != "assistant":
                continue
            answer = await self._step(task, Response((message,)), state)
            total += answer["reward"]
            state.last_step = answer
            if answer.get("terminated") or answer.get("truncated"):
                break
        if state.incarnation != self.server_incarnation():
            raise EnvSessionLost(f"NeMo Gym server {self.cfg.server!r} restarted during a replay")
        return VerifyResult(total, details=_ending(state.last_step))

    async def _verify(self, task: Task, response: Response, cookies: Cookies) -> VerifyResult:
        body = row_body(task.row)
        body["response"] = responses_object(task.row, response)
        reply = await self.http.post("/verify", body, cookies)
        self._expect_ok(reply, "/verify")
        where = f"NeMo Gym server {self.cfg.server!r}"
        return verify_result(self.http.json_object(reply, f"{where} /verify"), body, where)

    async def _reverify(self, task: Task, response: Response) -> VerifyResult:
        """A stored rollout, verified on a fresh session: its executed tool calls replayed first."""
        if self._reverify_mode == "unsupported":
            raise ReverifyUnsupported(
                f"NeMo Gym server {self.cfg.server!r} says its verdicts cannot be recomputed "
                "(GET /reverify_mode)"
            )
        cookies = Cookies()
        if self._reverify_mode != "stateless":
            state, _, _ = await self._open(task)
            cookies = state.cookies
            for call in response.tool_calls:
                if response.tool_output(call.id) is None:
                    continue  # never executed (the rollout ended at the call): not replayed
                try:
                    args = untrusted_json.loads(call.arguments_json) if call.arguments_json.strip() else {}
                except NotJson:
                    continue  # the agent answered it with an error without calling the server
                if _ROUTE.fullmatch(call.name) and call.name not in PROTOCOL_ROUTES:
                    await self.http.post(f"/{call.name}", args, cookies)
            if state.incarnation != self.server_incarnation():
                raise EnvSessionLost(f"NeMo Gym server {self.cfg.server!r} restarted during a replay")
        try:
            return await self._verify(task, response, cookies)
        finally:
            if "close_session" in self._routes and cookies.values:
                session = Session(
                    f"reverify-{uuid.uuid4().hex}",
                    self.context.name,
                    task,
                    BridgeState(cookies, self.server_incarnation()),
                )
                await self.close_session(session)
