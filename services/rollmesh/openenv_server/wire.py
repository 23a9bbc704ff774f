"""What travels between an OpenEnv client and `rollmesh serve openenv`: OpenEnv's wire format
(openenv-core 0.3 / openenv 0.10: `/reset`, `/step`, `/state`, `/schema`, `/metadata`, `/health`,
and the `/ws` session's messages), with rollmesh's action, observation and state models in it.

- An **action** is one assistant turn: `{"message": "<text>", "tool_calls": [{"id", "name",
  "arguments"}]}` (a call may also come in OpenAI's shape, `{"id", "type": "function", "function":
  {"name", "arguments"}}`; `arguments` an object or its JSON text). Unknown fields are refused, as
  OpenEnv's own `Action` refuses them.
- An **observation** is `{"messages": [...], "tools": [...], "info": {...}}` next to `reward` and
  `done`: reset's messages are the prompt (the row's input and the environment's opening), a step's
  are what the environment answered (tool results, its own messages); `tools` (reset only) is what
  the model may call; `info` holds the step's info and, at the end, verify's components, extracted
  answer, details and `masked`.
- **Reset** takes `seed` (row `seed % rows`), `index` (that row), `row` (a row itself) and
  `episode_id`; anything else is refused (OpenEnv's server silently drops what an environment's
  `reset` does not take; a dropped parameter here would play a row the caller did not ask for).
- **State** is OpenEnv's `State` (`episode_id`, `step_count`) with `environment`, `task_index`,
  `done` and `reward` (the episode's sum so far).

A WebSocket answer is `{"type": "observation" | "state" | "error", "data": ...}`; an error's data is
`{"message", "code"}` with OpenEnv's codes (`error_code`).
"""

from __future__ import annotations

from typing import Any
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationError
from pydantic import model_validator

from rollmesh.mesh.errors import RollmeshError
from rollmesh.openenv_server.errors import BadAction
from rollmesh.openenv_server.errors import BadReset
from rollmesh.openenv_server.errors import NoEpisode

Json = dict[str, Any]


class ToolCallIn(BaseModel):
    """One tool call of the turn."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default="", description="The call's id (made up when empty: call_<n>)")
    name: str = Field(min_length=1, description="The tool's name, one of the observation's `tools`")
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="The arguments: an object, or its JSON text"
    )

    @model_validator(mode="before")
    @classmethod
    def _openai_shape(cls, data: Any) -> Any:
        """OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}` as ours."""
        if isinstance(data, dict) and isinstance(data.get("function"), dict):
            fn = data["function"]
            rest = {k: v for k, v in data.items() if k not in ("function", "type")}
            return {**rest, **fn}
        return data


class Action(BaseModel):
    """One assistant turn: its text and its tool calls."""

    model_config = ConfigDict(extra="forbid")

    message: str = Field(default="", description="The assistant's text")
    tool_calls: list[ToolCallIn] = Field(default_factory=list, description="The turn's tool calls")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Not read (OpenEnv's Action field)")

    def assistant_message(self, first_call: int) -> Json:
        """The turn as an OpenAI chat message; calls without an id get `call_<n>` from `first_call`."""
        msg: Json = {"role": "assistant", "content": self.message}
        calls = []
        for n, c in enumerate(self.tool_calls, start=first_call):
            args = c.arguments if isinstance(c.arguments, str) else _dumps(c.arguments)
            calls.append(
                {
                    "id": c.id or f"call_{n}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": args},
                }
            )
        if calls:
            msg["tool_calls"] = calls
        return msg


class Observation(BaseModel):
    """What the environment shows after a reset or a step (`/schema`'s observation; `reward`,
    `done` and `metadata` travel beside it, as OpenEnv serializes observations)."""

    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]] = Field(description="Chat messages to append to the conversation")
    tools: list[dict[str, Any]] = Field(
        default_factory=list, description="Tools the model may call (reset): name, description, parameters"
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The step's info; verify's at the end")
    done: bool = Field(default=False, description="Whether the episode has terminated")
    reward: float | None = Field(default=None, description="This step's reward (None: none measured)")
    metadata: dict[str, Any] = Field(default_factory=dict, description="OpenEnv's Observation field")


class State(BaseModel):
    """OpenEnv's State and what rollmesh adds to it."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = Field(default=None, description="The episode's id (its verifier session)")
    step_count: int = Field(default=0, ge=0, description="Steps taken in the episode")
    environment: str = Field(default="", description="The rollmesh environment served")
    task_index: int | None = Field(default=None, description="The dataset row played (None: a given row)")
    done: bool = Field(default=False, description="Whether the episode is over")
    reward: float = Field(default=0.0, description="The episode's rewards so far, summed")


class ResetParams(BaseModel):
    """What a reset may say."""

    model_config = ConfigDict(extra="forbid")

    seed: int | None = Field(default=None, ge=0, description="Play row `seed % rows`")
    index: int | None = Field(default=None, ge=0, description="Play this row of the dataset")
    row: dict[str, Any] | None = Field(default=None, description="Play this row (a dataset row's JSON)")
    episode_id: str | None = Field(default=None, max_length=255, description="The episode's id")


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def _one_line(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:3]:
        where = ".".join(str(p) for p in e.get("loc", ())) or "(top)"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
    return "; ".join(parts) + more


def parse_action(data: Any) -> Action:
    """The action; BadAction naming the field when it is not one (`/schema`'s action)."""
    if not isinstance(data, dict):
        raise BadAction(f"an action is a JSON object (`/schema`'s action), got {type(data).__name__}")
    try:
        return Action.model_validate(data)
    except ValidationError as exc:
        raise BadAction(f"bad action: {_one_line(exc)}") from None


def parse_reset(data: Any) -> ResetParams:
    """The reset's parameters; BadReset naming what is wrong."""
    if data is None:
        return ResetParams()
    if not isinstance(data, dict):
        raise BadReset(f"reset's parameters are a JSON object, got {type(data).__name__}")
    try:
        return ResetParams.model_validate(data)
    except ValidationError as exc:
        raise BadReset(
            f"bad reset ({', '.join(ResetParams.model_fields)} are taken): {_one_line(exc)}"
        ) from None


def schemas() -> Json:
    """`/schema`: the action's, observation's and state's JSON schemas."""
    return {
        "action": Action.model_json_schema(),
        "observation": Observation.model_json_schema(),
        "state": State.model_json_schema(),
    }


def result(obs: Observation) -> Json:
    """A reset's or step's answer as OpenEnv serializes it: the observation without `reward`,
    `done` and `metadata`, which sit beside it (openenv 0.10 reads `metadata` there too)."""
    return {
        "observation": obs.model_dump(exclude={"reward", "done", "metadata"}),
        "reward": obs.reward,
        "done": obs.done,
        "metadata": obs.metadata,
    }


WsErrorCode = Literal[
    "INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR", "EXECUTION_ERROR", "SESSION_ERROR", "CAPACITY_REACHED"
]


def error_code(exc: BaseException) -> WsErrorCode:
    """OpenEnv's WebSocket error code for a failure: the client's fault in what it sent is a
    VALIDATION_ERROR, a step without an episode a SESSION_ERROR, the rest an EXECUTION_ERROR."""
    if isinstance(exc, BadAction | BadReset):
        return "VALIDATION_ERROR"
    if isinstance(exc, NoEpisode):
        return "SESSION_ERROR"
    return "EXECUTION_ERROR"


def ws_error(message: str, code: WsErrorCode) -> Json:
    return {"type": "error", "data": {"message": message, "code": code}}


def describe(exc: BaseException) -> str:
    """One line for a failure: a rollmesh error's code, message and reason; anything else its text."""
    if isinstance(exc, RollmeshError):
        return f"{exc.code.name}: {exc.message} [{exc.reason}]"
    return str(exc) or type(exc).__name__
