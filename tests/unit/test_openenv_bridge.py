"""The OpenEnv host bridge's logic (verifier/bridges/openenv_env.py) without a server: how an action
schema (GET /schema's `action`, as openenv-core's pydantic models give it) becomes a plan, how a turn
becomes an action under it, how reset and step answers are checked, and openenv.toml's errors.
tests/integration/test_openenv_host.py runs the same against real OpenEnv servers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.errors import ConfigError
from rollmesh.verifier import Response
from rollmesh.verifier.bridges.openenv_env import OpenEnvConfig
from rollmesh.verifier.bridges.openenv_env import action_plan
from rollmesh.verifier.bridges.openenv_env import listed_tools
from rollmesh.verifier.bridges.openenv_env import mcp_text
from rollmesh.verifier.bridges.openenv_env import observed
from rollmesh.verifier.bridges.openenv_env import turn_action
from rollmesh.verifier.errors import ActionNotBuildable
from rollmesh.verifier.errors import EnvServerBadReply

METADATA = {"additionalProperties": True, "type": "object", "title": "Metadata"}
#: `openenv init`'s template action (EchoAction): one required string field.
ECHO = {
    "additionalProperties": False,
    "properties": {"metadata": METADATA, "message": {"type": "string", "title": "Message"}},
    "required": ["message"],
    "title": "EchoAction",
    "type": "object",
}
#: tests/openenv_envs/guess_env's action: a required integer and an optional string.
GUESS = {
    "additionalProperties": False,
    "description": "Guess the secret number.",
    "properties": {
        "metadata": METADATA,
        "guess": {"type": "integer"},
        "note": {"type": "string", "default": ""},
    },
    "required": ["guess"],
    "title": "GuessAction",
    "type": "object",
}


#: OpenEnv's CallToolAction: an MCP environment's action (its tools listed by a list_tools step).
CALL_TOOL = {
    "additionalProperties": False,
    "properties": {
        "metadata": METADATA,
        "type": {"const": "call_tool", "default": "call_tool", "type": "string"},
        "tool_name": {"type": "string"},
        "arguments": {"additionalProperties": True, "type": "object"},
    },
    "required": ["tool_name"],
    "title": "CallToolAction",
    "type": "object",
}


def cfg(**fields: Any) -> OpenEnvConfig:
    return OpenEnvConfig(url="http://127.0.0.1:1", **fields)


def turn(text: str = "", *calls: tuple[str, str]) -> Response:
    tool_calls = tuple(ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(calls))
    return Response((Message("assistant", text, tool_calls),))


def test_a_schema_with_one_required_string_field_takes_the_models_text() -> None:
    plan = action_plan(ECHO, cfg(), "echo")
    assert (plan.mode, plan.text_field, plan.tool) == ("text", "message", None)
    assert "metadata" not in plan.parameters["properties"]  # the base class's field is the environment's
    action = turn_action(plan, turn("hello"))
    assert (action.value, action.error, action.others) == ({"message": "hello"}, "", ())


def test_a_schema_the_text_cannot_fill_is_offered_as_a_tool() -> None:
    plan = action_plan(GUESS, cfg(tool_name="guess_tool"), "guess")
    assert plan.mode == "tool" and plan.tool is not None and plan.tool.name == "guess_tool"
    params = json.loads(plan.tool.parameters_json)
    assert set(params["properties"]) == {"guess", "note"} and params["required"] == ["guess"]
    assert plan.tool.description == "Guess the secret number."
    action = turn_action(plan, turn("", ("guess_tool", '{"guess": 42}')))
    assert (action.value, action.call_id) == ({"guess": 42}, "call_0")


@pytest.mark.parametrize(
    ("calls", "error"),
    [
        ((), "call the tool `act`"),
        ((("act", "{not json"),), "the arguments are not JSON"),
        ((("act", "[1]"),), "must be a JSON object"),
        ((("act", '{"guess": "high"}'),), "arguments.guess must be integer"),
        ((("act", '{"guess": 3, "hint": 1}'),), "arguments.hint is not a known parameter"),
        ((("act", "{}"),), "arguments.guess is required"),
    ],
)
def test_a_turn_that_makes_no_valid_action_says_why(calls: tuple[tuple[str, str], ...], error: str) -> None:
    action = turn_action(action_plan(GUESS, cfg(), "guess"), turn("", *calls))
    assert action.value is None and error in action.error
    assert action.call_id == ("call_0" if calls else "")


def test_one_action_per_turn_and_every_other_call_is_left_to_be_answered() -> None:
    plan = action_plan(GUESS, cfg(), "guess")
    action = turn_action(plan, turn("", ("search", "{}"), ("act", '{"guess": 1}'), ("act", '{"guess": 2}')))
    assert action.value == {"guess": 1} and action.call_id == "call_1"
    assert [c.id for c in action.others] == ["call_0", "call_2"]


def test_text_mode_on_a_schema_the_text_cannot_fill_is_not_buildable() -> None:
    with pytest.raises(
        ActionNotBuildable, match=r"guess: the model's text cannot make an action.*guess \(integer\)"
    ):
        action_plan(GUESS, cfg(action="text"), "guess")
    # naming the field makes it buildable only when no other field is required
    with pytest.raises(ActionNotBuildable):
        action_plan(GUESS, cfg(action="text", text_field="note"), "guess")
    assert action_plan(ECHO, cfg(action="text", text_field="message"), "echo").text_field == "message"


@pytest.mark.parametrize(
    "schema",
    [None, [], {"type": "array"}, {"type": "object", "properties": {"metadata": METADATA}}],
)
def test_a_schema_with_no_fields_to_give_is_not_buildable(schema: Any) -> None:
    with pytest.raises(ActionNotBuildable):
        action_plan(schema, cfg(), "broken")


def test_tool_mode_takes_calls_even_where_text_could_fill_the_action() -> None:
    plan = action_plan(ECHO, cfg(action="tool"), "echo")
    assert plan.mode == "tool"
    assert turn_action(plan, turn("ignored", ("act", '{"message": "hi"}'))).value == {"message": "hi"}


def test_answers_are_checked_and_the_observation_is_kept_whole() -> None:
    seen = observed({"observation": {"hint": "lower", "left": 3}, "reward": -0.25, "done": False}, "step")
    assert (seen.reward, seen.done) == (-0.25, False)
    assert json.loads(seen.text("", "step")) == {"hint": "lower", "left": 3}
    assert seen.text("hint", "step") == "lower"
    assert observed({"observation": {}, "reward": None}, "reset").reward is None  # done defaults False
    with pytest.raises(EnvServerBadReply, match="`left` is int, not text"):
        seen.text("left", "step")


@pytest.mark.parametrize(
    "data",
    [
        None,
        "text",
        {"reward": 1.0, "done": True},
        {"observation": "hi", "reward": 1.0, "done": False},
        {"observation": {}, "reward": "1.0", "done": False},
        {"observation": {}, "reward": 1.0, "done": "yes"},
    ],
)
def test_a_malformed_observation_is_a_named_failure(data: Any) -> None:
    with pytest.raises(EnvServerBadReply):
        observed(data, "OpenEnv environment 'x' step")


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "openenv.toml").write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "one of `url`, `env_dir`, `app`"),
        ('url = "http://x"\nenv_dir = "e"\n', "one of `url`, `env_dir`, `app`"),
        ('url = "http://x"\naction = "json"\n', "`action` must be"),
        ('url = "http://x"\nmax_sessions = -1\n', "`max_sessions` must be"),
        ('url = "http://x"\nreset = 3\n', "[reset] must be a table"),
        ('url = "http://x"\nport = 3\n', "unknown keys port"),
        ('url = "127.0.0.1:8000"\n', "`url` must be an http:// or https:// URL"),
    ],
)
def test_openenv_toml_errors_name_the_file(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=f"openenv.toml: .*{re.escape(error)}"):
        OpenEnvConfig.load(write(tmp_path, text))


def test_openenv_toml_resolves_folders_against_its_own(tmp_path: Path) -> None:
    loaded = OpenEnvConfig.load(write(tmp_path, 'env_dir = "my_env"\nvenv = "oe"\n[reset]\nseed = 3\n'))
    assert loaded.env_dir == str(tmp_path / "my_env") and loaded.managed
    assert loaded.python == str(tmp_path / "oe" / "bin" / "python") and loaded.reset == {"seed": 3}


def test_an_mcp_environments_call_tool_action_takes_calls_to_its_listed_tools() -> None:
    """Not "text" (tool_name is its one required string field: the text would be a tool's name)."""
    plan = action_plan(CALL_TOOL, cfg(), "counter")
    assert plan.mode == "mcp" and plan.tool is None
    listed = listed_tools(
        {
            "tools": [
                {
                    "name": "add",
                    "description": "Add n.",
                    "input_schema": {
                        "type": "object",
                        "properties": {"n": {"type": "integer"}},
                        "required": ["n"],
                    },
                }
            ]
        },
        "counter",
    )
    schemas = {n: json.loads(t.parameters_json) for n, t in listed.items()}
    action = turn_action(plan, turn("", ("add", '{"n": 4}'), ("add", '{"n": 1}')), schemas)
    assert action.value == {"type": "call_tool", "tool_name": "add", "arguments": {"n": 4}}
    assert [c.id for c in action.others] == ["call_1"]
    assert "arguments.n is required" in turn_action(plan, turn("", ("add", "{}")), schemas).error
    assert "call one of the environment's tools (`add`)" in turn_action(plan, turn("4"), schemas).error
    with pytest.raises(EnvServerBadReply, match="no `tools` list"):
        listed_tools({"tools": None}, "counter")


def test_a_tool_calls_answer_is_the_text_of_its_result_or_its_error() -> None:
    text = {"type": "text", "text": "7", "annotations": None}
    assert mcp_text({"tool_name": "add", "result": {"content": [text], "data": 7}, "error": None}) == "7"
    error = {"error_type": "execution_error", "message": "boom"}
    assert json.loads(mcp_text({"tool_name": "add", "result": None, "error": error})) == {"error": error}
    assert json.loads(mcp_text({"tool_name": "add", "result": 3})) == {"tool_name": "add", "result": 3}
