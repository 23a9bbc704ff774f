"""rollmesh/openenv_server's logic without a transport: the wire format's parsing (actions in both
call shapes, resets, one-line refusals) and an episode over a recording fake of the verifier's
EnvPort (which calls it makes, in which order, and what ends an episode), for the paths the
integration tests' environments do not take: a stateless environment, tool calls that are the
answer, a tool that ends the agent, a verifier that fails mid-episode, rows given or picked."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any

import pytest

from rollmesh.mesh.errors import Internal
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.openenv_server import wire
from rollmesh.openenv_server.episode import Episode
from rollmesh.openenv_server.errors import BadAction
from rollmesh.openenv_server.errors import BadReset
from rollmesh.openenv_server.errors import NoEpisode
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.drivers.agent_loop import EnvStep
from rollmesh.scheduler.drivers.agent_loop import SessionOpened
from rollmesh.scheduler.drivers.agent_loop import ToolResult
from rollmesh.scheduler.errors import NoPrompt

Json = dict[str, Any]
ROWS = [
    {"responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]}, "expected_answer": i}
    for i in range(3)
]
TOOL = {"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}}


@dataclass
class FakePort:
    """The verifier's EnvPort, recording every call: `ends_agent` makes CallTool end the agent,
    `fail_step` makes CallTool raise."""

    takes_turns: bool = False
    ends_agent: bool = False
    fail_step: bool = False
    calls: list[tuple[Any, ...]] = field(default_factory=list)

    async def seed_session(self, environment: str, task: Json, session_id: str) -> SessionOpened:
        self.calls.append(("seed", session_id))
        return SessionOpened(tools=[TOOL], takes_turns=self.takes_turns)

    async def call_tool(self, session_id: str, call: Json) -> ToolResult:
        self.calls.append(("tool", session_id, call["id"], call["function"]["arguments"]))
        if self.fail_step:
            raise Internal("the tool broke")
        return ToolResult(output="ok", ends_agent=self.ends_agent)

    async def step(self, session_id: str, messages: list[Json]) -> EnvStep:
        self.calls.append(("step", session_id, len(messages)))
        return EnvStep(reward=0.25, done=False)

    async def verify(
        self, environment: str, task: Json, messages: list[Json], session_id: str
    ) -> VerifyResult:
        self.calls.append(("verify", session_id, [m["role"] for m in messages]))
        return VerifyResult(reward=float(task["expected_answer"]), extracted_answer="x")

    async def verify_group(self, environment: str, task: Json, members: Any) -> list[VerifyResult]:
        raise AssertionError("an episode never verifies a group")

    async def close_session(self, session_id: str) -> None:
        self.calls.append(("close", session_id))

    async def describe_environment(self, environment: str) -> EnvDescription:
        raise AssertionError("the server describes, not the episode")


def episode(port: FakePort, *, rows: list[Json] = ROWS, max_steps: int = 8, **description: Any) -> Episode:
    return Episode(port, "env", EnvDescription(**description), rows, session_prefix="p", max_steps=max_steps)


def test_an_action_takes_both_call_shapes_and_numbers_the_calls_without_ids() -> None:
    action = wire.parse_action(
        {
            "message": "hi",
            "tool_calls": [
                {"name": "add", "arguments": {"n": 1}},
                {"id": "x", "type": "function", "function": {"name": "add", "arguments": '{"n": 2}'}},
            ],
        }
    )
    msg = action.assistant_message(first_call=3)
    assert msg["content"] == "hi"
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        ("call_3", "add", '{"n": 1}'),
        ("x", "add", '{"n": 2}'),
    ]
    assert "tool_calls" not in wire.parse_action({"message": "only text"}).assistant_message(0)


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"text": "hi"}, "text"),
        ({"message": ["a"]}, "message"),
        ({"tool_calls": [{"arguments": {}}]}, "tool_calls.0.name"),
        ("hi", "a JSON object"),
    ],
)
def test_a_bad_action_is_one_line_naming_the_field(data: Any, names: str) -> None:
    with pytest.raises(BadAction) as err:
        wire.parse_action(data)
    assert names in err.value.message and "\n" not in err.value.message
    assert wire.error_code(err.value) == "VALIDATION_ERROR"


def test_a_reset_takes_only_its_parameters() -> None:
    assert wire.parse_reset(None) == wire.ResetParams()
    assert wire.parse_reset({"seed": 4, "episode_id": "e"}).seed == 4
    for bad in ({"seed": -1}, {"level": 3}, [1]):
        with pytest.raises(BadReset):
            wire.parse_reset(bad)


def test_a_result_is_openenvs_shape() -> None:
    obs = wire.Observation(messages=[], info={"a": 1}, reward=0.5, done=True)
    assert wire.result(obs) == {
        "observation": {"messages": [], "tools": [], "info": {"a": 1}},
        "reward": 0.5,
        "done": True,
        "metadata": {},
    }
    assert set(wire.schemas()) == {"action", "observation", "state"}


async def test_a_stateless_environment_opens_no_session_and_verifies_without_one() -> None:
    port = FakePort()
    ep = episode(port, stateless=True)
    first = await ep.reset(wire.ResetParams(index=2))
    assert first.messages == [{"role": "user", "content": "q2"}] and first.tools == []
    last = await ep.step(wire.parse_action({"message": "2"}))
    assert (last.reward, last.done, last.info["finish_reason"]) == (2.0, True, "stop")
    assert port.calls == [("verify", "", ["assistant"])]


async def test_rows_in_turn_by_seed_or_given() -> None:
    ep = episode(FakePort(), stateless=True)
    picked = []
    for params in (wire.ResetParams(), wire.ResetParams(), wire.ResetParams(seed=7), wire.ResetParams()):
        await ep.reset(params)
        picked.append(ep.state.task_index)
    assert picked == [0, 1, 1, 2]
    await ep.reset(wire.ResetParams(row={**ROWS[0], "expected_answer": 9}))
    assert ep.state.task_index is None
    assert (await ep.step(wire.parse_action({}))).reward == 9.0
    with pytest.raises(BadReset, match="responses_create_params"):
        await ep.reset(wire.ResetParams(row={"question": "?"}))
    with pytest.raises(BadReset, match="no dataset rows"):
        await episode(FakePort(), rows=[]).reset(wire.ResetParams())


async def test_an_empty_prompt_with_no_opening_is_no_prompt() -> None:
    port = FakePort()
    with pytest.raises(NoPrompt):
        await episode(port).reset(wire.ResetParams(row={"responses_create_params": {"input": []}}))
    assert port.calls == [("seed", "p/1"), ("close", "p/1")]


async def test_tool_calls_that_are_the_answer_are_not_run() -> None:
    port = FakePort()
    ep = episode(port, tool_calls_are_answer=True)
    await ep.reset(wire.ResetParams(index=1))
    last = await ep.step(wire.parse_action({"tool_calls": [{"name": "add"}]}))
    assert (last.done, last.reward, last.info["finish_reason"]) == (True, 1.0, "tool_calls")
    assert [c[0] for c in port.calls] == ["seed", "verify", "close"]


async def test_a_tool_that_ends_the_agent_ends_the_episode() -> None:
    port = FakePort(ends_agent=True)
    ep = episode(port)
    await ep.reset(wire.ResetParams(index=1, episode_id="mine"))
    last = await ep.step(wire.parse_action({"tool_calls": [{"name": "add", "arguments": {}}]}))
    assert (last.done, last.info["finish_reason"]) == (True, "agent_timeout")
    assert last.messages == [{"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "ok"}]
    assert port.calls == [
        ("seed", "mine"),
        ("tool", "mine", "call_0", "{}"),
        ("verify", "mine", ["assistant", "tool"]),
        ("close", "mine"),
    ]


async def test_turns_step_and_the_last_step_adds_verify() -> None:
    port = FakePort(takes_turns=True)
    ep = episode(port, max_steps=2)
    await ep.reset(wire.ResetParams(index=2))
    first = await ep.step(wire.parse_action({"message": "a"}))
    last = await ep.step(wire.parse_action({"message": "b"}))
    assert (first.reward, first.done) == (0.25, False)
    assert (last.reward, last.done, last.info["finish_reason"]) == (2.25, True, "max_steps")
    assert ep.state.reward == pytest.approx(2.5) and ep.state.step_count == 2
    with pytest.raises(NoEpisode, match="the episode is over"):
        await ep.step(wire.parse_action({"message": "c"}))


async def test_a_verifier_failure_ends_the_episode_and_closes_its_session() -> None:
    port = FakePort(fail_step=True)
    ep = episode(port)
    with pytest.raises(NoEpisode, match="no episode was started"):
        await ep.step(wire.parse_action({}))
    await ep.reset(wire.ResetParams(index=0))
    with pytest.raises(Internal):
        await ep.step(wire.parse_action({"tool_calls": [{"name": "add"}]}))
    assert port.calls[-1] == ("close", "p/1")
    with pytest.raises(NoEpisode, match="its last step failed"):
        await ep.step(wire.parse_action({}))
    assert wire.error_code(Internal("x")) == "EXECUTION_ERROR"
