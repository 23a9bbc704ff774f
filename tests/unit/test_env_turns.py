"""Environment turns: the plugin hook (`Environment.step`, `Seeded`) as the verifier service runs and
checks it, and the agent loop that steps a session after each assistant turn (first messages from
seeding, step messages appended as prompt, calls to the environment's own tools run by CallTool and
the rest left to its step, `done` or `max_steps` ends it, reward = steps + verify)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import grpc
import pytest

from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import EnvStep
from rollmesh.scheduler.drivers.agent_loop import SessionOpened
from rollmesh.scheduler.drivers.agent_loop import ToolResult
from rollmesh.scheduler.drivers.agent_loop import run_agent
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.tokens import build_token_record
from rollmesh.scheduler.tokens import validate_token_record
from rollmesh.verifier import Environment
from rollmesh.verifier import EnvTurn
from rollmesh.verifier import Message
from rollmesh.verifier import Response
from rollmesh.verifier import Seeded
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import ToolCall
from rollmesh.verifier import ToolOutput
from rollmesh.verifier import ToolSpec
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import tool
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.errors import BadEnvTurn
from rollmesh.verifier.errors import TakesNoTurns
from rollmesh.verifier.errors import ToolNotFound
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.testing import opening
from rollmesh.verifier.testing import seeded
from rollmesh.verifier.testing import task
from rollmesh.verifier.workers import WorkerPool
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import counter_tool_script
from tests.games import Guess
from tests.games import guess_row

Json = dict[str, Any]


class _Plain(Environment):
    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        return VerifyResult(1.0)


class _Answers(_Plain):
    """Steps with whatever `answer` (a class attribute a test sets) holds; seeds with `opening`."""

    answer: Any = None
    opening: Any = ()

    async def seed_session(self, task: Task) -> Seeded:
        return Seeded(state={}, messages=self.opening)

    async def step(self, session: Session, turn: Response) -> Any:
        return self.answer


def _service(**envs: type[Environment]) -> VerifierService:
    cfg = VerifierConfig()
    loaded = {
        name: Loaded(name, cls(EnvContext(name, Path("."), cfg, WorkerPool(1))), "test")
        for name, cls in envs.items()
    }
    return VerifierService(cfg, Discovery(loaded, {}))


# ---- the plugin hook, through the verifier service -------------------------------------------------


async def test_seeding_gives_the_first_messages_and_steps_answer_turns() -> None:
    svc = _service(guess=Guess, plain=_Plain)
    info = svc.describe("guess")
    assert info.takes_turns and not info.stateless
    assert not svc.describe("plain").takes_turns and svc.describe("plain").stateless
    seeded = await svc.seed_session("guess", json.dumps(guess_row(30)), "g")
    assert seeded.takes_turns and [m.role for m in seeded.messages] == ["user"]
    assert "between 1 and 100" in seeded.messages[0].content
    assert [t.name for t in seeded.tools] == ["hint"] and [t.name for t in seeded.session_tools] == ["peek"]
    assert seeded.session.tools == seeded.session_tools

    low = await svc.step("g", Response((Message("assistant", "25"),)))
    assert (low.messages, low.reward, low.done) == ((Message("user", "25 is too low"),), -0.125, False)
    peek = ToolCall("c1", "peek", "{}")
    called = await svc.step("g", Response((Message("assistant", "", (peek,)),)))
    assert called.messages == (Message("tool", "even", tool_call_id="c1", name="peek"),)
    assert (called.reward, called.done, dict(called.info)) == (0.0, False, {"calls": 1})
    won = await svc.step("g", Response((Message("assistant", "30"),)))
    assert (won.messages, won.reward, won.done, dict(won.info)) == ((), 1.0, True, {"guesses": 2})


async def test_the_testing_helpers_unwrap_seeded() -> None:
    env = Guess(EnvContext("guess", None, VerifierConfig(), WorkerPool(1)))
    t = task(prompt="Play.", verifier_metadata={"secret": 3})
    assert (await seeded(env, t)).state == {"guesses": [], "won": False}
    assert [m.role for m in await opening(env, t)] == ["user"]
    assert await opening(_Plain(EnvContext("p", None, VerifierConfig(), WorkerPool(1))), t) == ()


async def test_stepping_an_environment_that_takes_no_turns_is_a_failed_precondition() -> None:
    svc = _service(plain=_Plain)
    await svc.seed_session("plain", "{}", "p")
    with pytest.raises(TakesNoTurns) as err:
        await svc.step("p", Response((Message("assistant", "hi"),)))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.reason == "ENVIRONMENT_TAKES_NO_TURNS"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"reward": 1.0}, "not EnvTurn"),
        (EnvTurn(reward=math.nan), "not a finite number"),
        (EnvTurn(reward=math.inf), "not a finite number"),
        (EnvTurn(reward=True), "not a finite number"),
        (EnvTurn(messages=(Message("assistant", "I win"),)), "role 'assistant'"),
        (EnvTurn(messages=[{"role": "user", "content": "x"}]), "sequence of Message"),  # type: ignore[list-item]
        (EnvTurn(info={"at": object()}), "not JSON"),
        (EnvTurn(info={"x": math.nan}), "not JSON"),
    ],
)
async def test_a_step_answer_the_loop_cannot_use_is_bad_env_turn(answer: Any, why: str) -> None:
    svc = _service(answers=_Answers)
    _Answers.answer = answer
    await svc.seed_session("answers", "{}", "a")
    with pytest.raises(BadEnvTurn) as err:
        await svc.step("a", Response((Message("assistant", "hi"),)))
    assert why in err.value.message and err.value.code == grpc.StatusCode.INTERNAL


class _Lister(_Plain):
    """Lists a tool per session (named in the row) and answers it itself: no turns."""

    tools_of: Any = None

    async def seed_session(self, task: Task) -> Seeded:
        default = (ToolSpec.of(str(task.row["tool"]), "", {"type": "object"}),)
        return Seeded(state={}, tools=default if self.tools_of is None else self.tools_of)

    async def call_tool(self, session: Session, call: ToolCall) -> ToolOutput:
        if call.name not in {t.name for t in session.tools}:
            raise KeyError(call.name)
        return ToolOutput(call.id, f"{call.name} ran")


async def test_tools_given_at_seed_time_are_the_sessions_own() -> None:
    svc = _service(lister=_Lister)
    a = await svc.seed_session("lister", json.dumps({"tool": "alpha"}), "a")
    b = await svc.seed_session("lister", json.dumps({"tool": "beta"}), "b")
    assert [t.name for t in a.session_tools] == ["alpha"] and [t.name for t in b.session_tools] == ["beta"]
    assert a.tools == [] and not a.takes_turns
    assert (await svc.call_tool("a", ToolCall("c", "alpha", "{}"))).output == "alpha ran"
    with pytest.raises(ToolNotFound) as err:
        await svc.call_tool("a", ToolCall("c", "beta", "{}"))
    assert "tools: alpha" in err.value.message


@pytest.mark.parametrize(
    ("tools", "why"),
    [
        (("alpha",), "sequence of ToolSpec"),
        ((ToolSpec.of("x", "", {}), ToolSpec.of("x", "", {})), "'x' is offered twice"),
        ((ToolSpec.of("", "", {}),), "has no name"),
    ],
)
async def test_seed_time_tools_the_model_cannot_be_offered_are_bad_env_turn(tools: Any, why: str) -> None:
    svc = _service(lister=_Lister)
    _Lister.tools_of = tools
    try:
        with pytest.raises(BadEnvTurn) as err:
            await svc.seed_session("lister", json.dumps({"tool": "alpha"}), "a")
    finally:
        _Lister.tools_of = None
    assert why in err.value.message and len(svc.sessions) == 0


async def test_a_session_tool_named_like_an_environment_tool_is_bad_env_turn() -> None:
    class Both(_Lister):
        @tool
        async def alpha(self, session: Session) -> str:
            """Alpha."""
            return "own"

    svc = _service(both=Both)
    with pytest.raises(BadEnvTurn, match="'alpha' is offered twice"):
        await svc.seed_session("both", json.dumps({"tool": "alpha"}), "a")


async def test_seeding_with_an_assistant_message_is_bad_env_turn() -> None:
    svc = _service(answers=_Answers)
    _Answers.opening = (Message("assistant", "I already answered"),)
    try:
        with pytest.raises(BadEnvTurn) as err:
            await svc.seed_session("answers", "{}", "a")
    finally:
        _Answers.opening = ()
    assert "seed_session returned a message with role 'assistant'" in err.value.message
    assert len(svc.sessions) == 0


# ---- the agent loop ------------------------------------------------------------------------------


@dataclass
class TurnsEnv:
    """An EnvPort whose sessions take turns: `script` answers the steps in order; `hint` is its own
    tool (CallTool), every other call is its steps' to answer."""

    script: list[EnvStep]
    opening: list[Json] = field(default_factory=lambda: [{"role": "user", "content": "Begin."}])
    verdict: float = 0.25
    stepped: list[list[Json]] = field(default_factory=list)
    tool_calls: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    async def seed_session(self, environment: str, task: Json, session_id: str) -> SessionOpened:
        tools = [{"name": "hint", "description": "", "parameters": {"type": "object"}}]
        peek = {"name": "peek", "description": "", "parameters": {"type": "object"}}
        return SessionOpened(tools=tools, messages=list(self.opening), takes_turns=True, session_tools=[peek])

    async def call_tool(self, session_id: str, call: Json) -> ToolResult:
        self.tool_calls.append(call["function"]["name"])
        return ToolResult("a hint")

    async def step(self, session_id: str, messages: list[Json]) -> EnvStep:
        self.stepped.append(messages)
        return self.script.pop(0)

    async def verify(
        self, environment: str, task: Json, messages: list[Json], session_id: str
    ) -> VerifyResult:
        return VerifyResult(reward=self.verdict)

    async def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)

    async def describe_environment(self, environment: str) -> Any:
        raise AssertionError("not used by run_agent")


def _user(text: str) -> Json:
    return {"role": "user", "content": text}


async def _run(model: LocalModel, env: TurnsEnv, max_steps: int = 8) -> Any:
    task = {"responses_create_params": {"input": [_user("Play.")]}}
    settings = AgentSettings(environment="turns", max_steps=max_steps, sampling={"logprobs": True})
    return await run_agent(
        job_id="j", key=RolloutKey(0, 0), task=task, seed=1, settings=settings, model=model, env=env
    )


def _says(*replies: Json) -> LocalModel:
    return LocalModel(lambda req, turn: replies[turn])


async def test_the_loop_steps_each_turn_until_done_and_sums_the_rewards() -> None:
    model = _says({"content": "50"}, {"content": "75"}, {"content": "62"})
    env = TurnsEnv(
        [
            EnvStep([_user("50 is too low")], reward=-0.125),
            EnvStep([_user("75 is too high")], reward=-0.125, info={"n": 2}),
            EnvStep([], reward=1.0, done=True),
        ]
    )
    out = await _run(model, env)
    roles = [(m["role"], m["content"]) for m in out.messages]
    assert roles == [
        ("user", "Begin."),
        ("assistant", "50"),
        ("user", "50 is too low"),
        ("assistant", "75"),
        ("user", "75 is too high"),
        ("assistant", "62"),
    ]
    # the first model call saw the input, then the seeded message; each step saw its turn only
    assert model.calls[0].messages == [_user("Play."), _user("Begin.")]
    assert [[m["content"] for m in s] for s in env.stepped] == [["50"], ["75"], ["62"]]
    assert out.finish_reason == "stop" and len(out.turns) == 3
    assert [s.record() for s in out.steps] == [
        {"reward": -0.125, "done": False, "info": {}},
        {"reward": -0.125, "done": False, "info": {"n": 2}},
        {"reward": 1.0, "done": True, "info": {}},
    ]
    assert out.reward == -0.125 * 2 + 1.0 + 0.25 and out.verdict.reward == 0.25
    assert env.closed == ["j/0/0"] and model.closed == ["j/0/0"]
    # the environment's messages are prompt: the record trains on the three answers only
    rec = build_token_record(out.turns, logprobs_wanted=True)
    assert validate_token_record(rec) == []
    trained = [rec.token_ids[i] for i, m in enumerate(rec.loss_mask) if m]
    assert trained == [t for turn in out.turns for t in turn.output_token_ids]
    added = slice(rec.turns[1].prompt_start, rec.turns[1].output_start)
    assert "50 is too low" in "".join(map(chr, rec.token_ids[added])) and not any(rec.loss_mask[added])


async def test_without_done_the_loop_ends_at_max_steps() -> None:
    model = _says({"content": "1"}, {"content": "2"})
    env = TurnsEnv([EnvStep([_user("no")], reward=-1.0), EnvStep([_user("no")], reward=-1.0)])
    out = await _run(model, env, max_steps=2)
    assert out.finish_reason == "max_steps" and [s.done for s in out.steps] == [False, False]
    assert out.reward == -2.0 + 0.25 and out.messages[-1] == _user("no")


async def test_calls_to_its_own_tools_run_the_rest_are_answered_by_its_step() -> None:
    calls = [{"name": "hint", "arguments": {}}, {"name": "peek", "arguments": {}}]
    model = _says({"content": "", "tool_calls": calls}, {"content": "7"})
    peeked = {"role": "tool", "tool_call_id": "call_0_1", "name": "peek", "content": "odd"}
    env = TurnsEnv([EnvStep([peeked]), EnvStep([], reward=1.0, done=True)])
    out = await _run(model, env)
    assert [t["name"] for t in model.calls[0].tools] == ["hint", "peek"]  # the session's tool offered too
    assert env.tool_calls == ["hint"]
    hinted = {"role": "tool", "tool_call_id": "call_0_0", "name": "hint", "content": "a hint"}
    # the step saw the assistant turn and the result of the call to the environment's own tool
    assert [m["role"] for m in env.stepped[0]] == ["assistant", "tool"] and env.stepped[0][1] == hinted
    assert out.messages[1:5] == [out.turns[0].message, hinted, peeked, out.turns[1].message]
    assert out.reward == 1.25 and out.finish_reason == "stop"


async def test_a_turn_cut_by_length_is_still_stepped() -> None:
    model = LocalModel(lambda req, turn: {"content": "5"})
    env = TurnsEnv([EnvStep([_user("go on")]), EnvStep([], reward=1.0, done=True)])
    original = model.generate

    async def cut_first(call: Any) -> Any:
        turn = await original(call)
        if len(model.calls) == 1:
            turn.finish_reason = "length"
        return turn

    model.generate = cut_first  # type: ignore[method-assign]
    out = await _run(model, env)
    assert len(env.stepped) == 2 and out.finish_reason == "stop" and out.reward == 1.25


async def test_when_tool_calls_are_the_answer_none_runs_and_the_first_turn_with_calls_ends() -> None:
    model, env = LocalModel(counter_tool_script), LocalEnv()
    task = {
        "responses_create_params": {"input": [_user("Add 4 and 5")]},
        "expected_answer": "9",
    }
    settings = AgentSettings(environment="session_state", max_steps=8, tool_calls_are_answer=True)
    out = await run_agent(
        job_id="j", key=RolloutKey(0, 0), task=task, seed=1, settings=settings, model=model, env=env
    )
    assert env.tool_calls == [] and len(out.turns) == 1 and out.finish_reason == "tool_calls"
    assert [m["role"] for m in out.messages] == ["assistant"]
    assert out.messages[0]["tool_calls"][0]["function"]["name"] == "increment"
