"""A verifiers environment (PrimeIntellect's `verifiers`: the 0.3.x API, or 0.4's `verifiers.v1`
tasksets): an `Environment` whose turns, tools and reward are served by the environment's own code in
its own virtualenv (the bridge; no port needed), while rollmesh's scheduler keeps the loop.

Declared as `environments/<name>/verifiers.toml` in any artifact root (no env.py):

    env_id = "vf_calc"                   # what `verifiers.load_environment(env_id, ...)` loads: an
                                         # installed environment package (vf-install), or a module
    # or, for verifiers 0.4:  taskset = "vf_v1_calc"   (a `verifiers.v1` Taskset plugin; its config
    #                         in a [config] table, e.g. [[config.task.judges]]; served by
    #                         _verifiers_v1_server.py, same protocol)
    python = "/opt/vf-venv/bin/python"   # its interpreter (or venv = "/opt/vf-venv"; default
                                         # ROLLMESH_VERIFIERS_PYTHON)
    paths = ["."]                        # folders put on the server's sys.path (a module not installed)
    timeout_s = 60                       # per HTTP call
    [args]                               # load_environment's keyword arguments
    max_turns = 4

The verifier runs verifier/bridges/_verifiers_server.py in that interpreter as a sidecar (launch/sidecar.py:
loopback port, health, restart with backoff, BROKEN while down, its log, stopped with the verifier)
and speaks its small JSON protocol (see that file). Every verifiers environment takes turns here:
- SeedSession: POST /seed with the row: verifiers' `init_state` + `setup_state`; the state's tool
  definitions (ToolEnv, StatefulToolEnv: with their per-session arguments hidden, as verifiers
  shows them to the model) are the session's tools (`Seeded.tools`), offered to the model.
- Step: each assistant turn goes to POST /step: verifiers' stop conditions say `done`, else
  `env_response` answers it (the tools run there, StatefulToolEnv's `update_tool_args` injecting the
  session's arguments; a MultiTurnEnv's reply). A SingleTurnEnv is done after its one turn.
- Verify: POST /score with the rollout's messages after the prompt as the completion:
  `rubric.score_rollout` on the session's state gives the reward; each reward and metric function's
  value is a reward component. A session-less verify (`rollmesh reverify`) replays the row's
  episode on a fresh state (seed, then each assistant turn through /step) and scores that.
- A rubric with group reward functions scores groups (`scores_groups`, from GET /'s `group`): the
  scheduler verifies a task's rollouts together, POST /score_group with each rollout's session and
  completion: verifiers' `rubric.score_group` on their states. /score on it is refused (409:
  GroupScored), never scored alone.
- Judges ask rollmesh's model: with VerifierConfig.judge_url (the gateway's OpenAI facade; the
  embedded mesh's own), every 0.3 JudgeRubric and every 0.4 plugged judge that names no endpoint is
  pointed there, with the verifier's API key and judge_model ("": the gateway's default model).
Failures are named, as the NeMo Gym bridge names them (EnvServerError, EnvServerBadReply,
EnvServerUnreachable, EnvSessionLost when the server restarted under a seeded session). The
environment's own scoring raising (a reward function, a judge, a parser, math-verify's timeout:
each of which verifiers counts 0) is RewardFunctionFailed (422), never a reward of 0.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh.launch.sidecar import Sidecar
from rollmesh.launch.sidecar import SidecarSpec
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.verifier.bridges.foreign import BridgeConfig
from rollmesh.verifier.bridges.foreign import ForeignServerEnvironment
from rollmesh.verifier.bridges.foreign import folder_of
from rollmesh.verifier.bridges.foreign import numbers_of
from rollmesh.verifier.bridges.foreign import reward_of
from rollmesh.verifier.bridges.foreign import sidecar_spec
from rollmesh.verifier.bridges.http_bridge import Json
from rollmesh.verifier.bridges.http_bridge import Reply
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import EnvTurn
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import Seeded
from rollmesh.verifier.environment import Session
from rollmesh.verifier.environment import Task
from rollmesh.verifier.errors import BadTask
from rollmesh.verifier.errors import EnvServerBadReply
from rollmesh.verifier.errors import EnvServerError
from rollmesh.verifier.errors import GroupScored
from rollmesh.verifier.errors import RewardFunctionFailed

log = get_logger("rollmesh.verifier.bridges.verifiers_env")

CONFIG_FILE = "verifiers.toml"  # marks a folder of this kind (registered in bridges/__init__.py)
LAUNCHER = Path(__file__).with_name("_verifiers_server.py")
LAUNCHER_V1 = Path(__file__).with_name("_verifiers_v1_server.py")
#: The variable holding the verifier's API key in the server process (its judges' key).
JUDGE_KEY_VAR = "ROLLMESH_JUDGE_API_KEY"


@dataclass(frozen=True, kw_only=True)
class VerifiersConfig(BridgeConfig):
    """An environment's verifiers.toml."""

    config_file = CONFIG_FILE
    python_var = "ROLLMESH_VERIFIERS_PYTHON"
    required = ("env_id", "taskset")
    required_what = "what verifiers.load_environment loads, or a verifiers 0.4 taskset"

    env_id: str = ""
    taskset: str = ""
    paths: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def checked(cls, raw: dict[str, Any], folder: Path, path: Path) -> dict[str, Any]:
        paths = raw.get("paths", [])
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise ConfigError(f"{path}: `paths` must be a list of folders")
        raw["paths"] = tuple(str((folder / p).resolve()) for p in paths)
        if not isinstance(raw.get("args", {}), dict):
            raise ConfigError(f"{path}: [args] must be a table of load_environment's keyword arguments")
        if not isinstance(raw.get("config", {}), dict):
            raise ConfigError(f"{path}: [config] must be a table (the taskset's config)")
        if raw.get("taskset") and raw.get("args"):
            raise ConfigError(f"{path}: [args] is for env_id; a taskset takes [config]")
        if raw.get("env_id") and raw.get("config"):
            raise ConfigError(f"{path}: [config] is for a taskset; env_id takes [args]")
        return raw

    @property
    def who(self) -> str:
        return f"verifiers environment {self.name!r}"

    @property
    def name(self) -> str:
        return self.taskset or self.env_id

    @property
    def launcher(self) -> Path:
        """The server script: 0.4 tasksets have their own (same protocol)."""
        return LAUNCHER_V1 if self.taskset else LAUNCHER

    def job(self, judge: Json | None = None) -> Json:
        """What the server process is told to load (ROLLMESH_VERIFIERS_ENV); `judge` points its judges."""
        if self.taskset:
            return {"taskset": self.taskset, "config": self.config, "paths": list(self.paths), "judge": judge}
        return {"env_id": self.env_id, "args": self.args, "paths": list(self.paths), "judge": judge}


@dataclass
class VfSession:
    """A rollout session on the server: its id there, and the server incarnation that seeded it."""

    id: str
    incarnation: int


def completion(task: Task, response: Response) -> list[Json]:
    """The rollout after the prompt as OpenAI chat messages (verifiers' `completion`). The episode's
    first observation is not there: a verifiers environment starts with its prompt alone."""
    del task
    return [m.to_openai() for m in response.messages]


def score_result(reply: Json, where: str) -> VerifyResult:
    """A /score answer as a VerifyResult; EnvServerBadReply when it has no numeric reward."""
    return VerifyResult(reward_of(reply, where, "/score"), numbers_of(reply.get("metrics")))


class VerifiersEnvironment(ForeignServerEnvironment):
    """A verifiers 0.3.x environment behind the Environment API (see the module docstring)."""

    def __init__(self, context: EnvContext) -> None:
        super().__init__(context)
        self.cfg = VerifiersConfig.load(folder_of(context, "a verifiers environment", CONFIG_FILE))
        what = "verifiers taskset" if self.cfg.taskset else "verifiers environment"
        self.where = f"{what} {self.cfg.name!r}"
        sidecar = Sidecar(self._sidecar_spec(self.cfg.interpreter()))
        self.attach(self.where, "", self.cfg.timeout_s, sidecar)
        self.kind = ""
        self.group = False  # the rubric has group reward functions (GET /): scores groups

    def _sidecar_spec(self, python: str) -> SidecarSpec:
        return sidecar_spec(
            tag=f"verifiers-{self.context.name}",
            name=f"{self.where} (environment {self.context.name!r})",
            argv=(python, str(self.cfg.launcher)),
            env={"ROLLMESH_VERIFIERS_ENV": json.dumps(self.cfg.job(self._judge())), **self._judge_env()},
            probe=self._probe,
            start_timeout_s=self.cfg.start_timeout_s,
            readable=[str(self.context.path), *self.cfg.paths],
        )

    def _judge(self) -> Json | None:
        cfg = self.context.config
        if not cfg.judge_url:
            return None
        return {"base_url": cfg.judge_url, "model": cfg.judge_model, "api_key_var": JUDGE_KEY_VAR}

    def _judge_env(self) -> dict[str, str]:
        """The judge's key; and OpenAI's own variables, so a client an environment builds with
        verifiers' defaults at load (`AsyncOpenAI()`) asks the facade too."""
        cfg = self.context.config
        key = cfg.server.api_key or "EMPTY"
        if not cfg.judge_url:
            return {JUDGE_KEY_VAR: key}
        return {JUDGE_KEY_VAR: key, "OPENAI_BASE_URL": cfg.judge_url, "OPENAI_API_KEY": key}

    async def _probe(self, address: str) -> bool:
        del address
        try:
            reply = await self.http._once("GET", "/", None, None)
        except Exception:
            return False
        if reply.ok and not self.kind:
            info = self.http.json_object(reply, "GET /")
            kind = info.get("kind")
            self.kind = kind if isinstance(kind, str) else ""
            self.group = info.get("group") is True
        return reply.ok

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        await super().start()
        log.info("verifiers_environment_ready", environment=self.context.name, kind=self.kind)

    def summary(self) -> str:
        kind = f" ({self.kind})" if self.kind else ""
        return self.cfg.description or f"{self.where}{kind}"

    def takes_turns(self) -> bool:
        return True

    def scores_groups(self) -> bool:
        return self.group

    def _state(self, session: Session) -> VfSession:
        return self.session_state(session, VfSession)

    # -- the protocol ---------------------------------------------------------------------------------

    async def _call(self, path: str, body: Json) -> Json:
        reply = await self.http.post(path, body)
        self._expect_ok(reply, path)
        return self.http.json_object(reply, f"{self.where} {path}")

    def _expect_ok(self, reply: Reply, what: str) -> None:
        if reply.ok:
            return
        try:
            text = str(json.loads(reply.text).get("error", reply.text))
        except (ValueError, AttributeError):
            text = reply.text
        text = " ".join(text.split())[:300]
        if reply.status == 409:
            raise GroupScored(f"{self.where}: {text}")
        if reply.status == 422:
            raise RewardFunctionFailed(f"{self.where}: {what}: {text}")
        if reply.status == 400:
            raise BadTask(f"{self.where} refused the row at {what}: {text}")
        raise EnvServerError(
            f"{self.where}: {what} answered {reply.status}: {text}",
            metadata={"http_status": str(reply.status)},
        )

    async def seed_session(self, task: Task) -> Seeded:
        state = VfSession(uuid.uuid4().hex, self.server_incarnation())
        answer = await self._call("/seed", {"session": state.id, "row": dict(task.row)})
        tools = answer.get("tools")
        specs = tuple(
            ToolSpec.of(
                str(t["function"].get("name", "")),
                str(t["function"].get("description", "")),
                t["function"].get("parameters") or {"type": "object", "properties": {}},
            )
            for t in (tools if isinstance(tools, list) else [])
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        )
        return Seeded(state=state, tools=specs)

    async def step(self, session: Session, turn: Response) -> EnvTurn:
        state = self._state(session)
        body = {"session": state.id, "messages": [m.to_openai() for m in turn.messages]}
        answer = await self._call("/step", body)
        self._state(session)
        raw = answer.get("messages")
        messages = tuple(
            Message.from_openai(m) for m in (raw if isinstance(raw, list) else []) if isinstance(m, dict)
        )
        if any(m.role == "assistant" for m in messages):
            raise EnvServerBadReply(f"{self.where}: /step answered an assistant message")
        return EnvTurn(messages=messages, done=answer.get("done") is True)

    async def close_session(self, session: Session) -> None:
        state = session.state
        if isinstance(state, VfSession):
            reply = await self.http.post("/close", {"session": state.id})
            if not reply.ok:
                log.debug("verifiers_close_failed", session_id=session.id, status=reply.status)

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        body: Json = {"row": dict(task.row), "completion": completion(task, response)}
        if session is not None:
            body["session"] = self._state(session).id
        answer = await self._call("/score", body)
        if session is not None:
            self._state(session)
        return score_result(answer, self.where)

    async def verify_group(
        self, task: Task, responses: Sequence[Response], sessions: Sequence[Session | None]
    ) -> list[VerifyResult]:
        members: list[Json] = []
        for response, session in zip(responses, sessions, strict=True):
            member: Json = {"completion": completion(task, response)}
            if session is not None:
                member["session"] = self._state(session).id
            members.append(member)
        answer = await self._call("/score_group", {"row": dict(task.row), "members": members})
        for session in sessions:
            if session is not None:
                self._state(session)
        results = answer.get("results")
        if not isinstance(results, list) or len(results) != len(members):
            raise EnvServerBadReply(
                f"{self.where}: /score_group answered {len(results) if isinstance(results, list) else 'no'} "
                f"results for {len(members)} rollouts"
            )
        return [
            score_result(r if isinstance(r, dict) else {}, f"{self.where} (rollout {i})")
            for i, r in enumerate(results)
        ]
