"""The built-in agent loop over in-process ports: tool calls, sessions always closed, max_steps."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import input_messages
from rollmesh.scheduler.drivers.agent_loop import row_sampling
from rollmesh.scheduler.drivers.agent_loop import row_tools
from rollmesh.scheduler.drivers.agent_loop import run_agent
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.tokens import build_token_record
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import counter_tool_script


def _task(q: str, expected: str, **params: object) -> dict[str, object]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": q}], **params},
        "expected_answer": expected,
    }


async def test_tool_calls_session_state_flow() -> None:
    model, env = LocalModel(counter_tool_script), LocalEnv()
    out = await run_agent(
        job_id="j",
        key=RolloutKey(3, 1),
        task=_task("Add 4 and 5", "9"),
        seed=7,
        settings=AgentSettings(environment="session_state", max_steps=8),
        model=model,
        env=env,
    )
    # increment(4), increment(5), get_count, then the answer
    assert [m["role"] for m in out.messages] == ["assistant", "tool"] * 3 + ["assistant"]
    assert [json.loads(c["function"]["arguments"]) for c in env.tool_calls] == [{"by": 4}, {"by": 5}, {}]
    assert out.messages[-1]["content"] == "9" and out.verdict.reward == 1.0
    assert out.finish_reason == "stop" and len(out.turns) == 4
    # every turn used the rollout key as session id, the env tools were offered, the seed was set
    assert {c.session_id for c in model.calls} == {"j/3/1"}
    assert [t["name"] for t in model.calls[0].tools] == ["increment", "get_count"]
    assert all(c.sampling["seed"] == 7 for c in model.calls)
    # both sessions closed; the token record lines up across turns
    assert env.closed == ["j/3/1"] and model.closed == ["j/3/1"] and model.open_sessions == 0
    rec = build_token_record(out.turns)
    assert len(rec.turns) == 4 and sum(rec.loss_mask) == sum(len(t.output_token_ids) for t in out.turns)


async def test_max_steps_stops_the_loop() -> None:
    model, env = LocalModel(counter_tool_script), LocalEnv()
    out = await run_agent(
        job_id="j",
        key=RolloutKey(0, 0),
        task=_task("Add 1 and 2", "3"),
        seed=0,
        settings=AgentSettings(environment="session_state", max_steps=2),
        model=model,
        env=env,
    )
    assert out.finish_reason == "max_steps" and len(out.turns) == 2 and out.verdict.reward == 0.0


async def test_a_tool_answer_that_ends_the_agent_stops_the_loop_and_verifies() -> None:
    """An environment that ends the agent with a call's answer (a container task whose agent time is
    up: ToolResult.ends_agent): no more model turns, finish reason "agent_timeout", then verify."""
    from rollmesh.scheduler.drivers.agent_loop import ToolResult

    class TimedOut(LocalEnv):
        async def call_tool(self, session_id: str, call: Any) -> Any:
            await super().call_tool(session_id, call)
            return ToolResult("error: the agent's time is up", is_error=True, ends_agent=True)

    model, env = LocalModel(counter_tool_script), TimedOut()
    out = await run_agent(
        job_id="j",
        key=RolloutKey(0, 0),
        task=_task("Add 1 and 2", "3"),
        seed=0,
        settings=AgentSettings(environment="session_state", max_steps=8),
        model=model,
        env=env,
    )
    assert out.finish_reason == "agent_timeout" and len(out.turns) == 1 and len(env.tool_calls) == 1
    assert [m["role"] for m in out.messages] == ["assistant", "tool"] and out.verdict.reward == 0.0
    assert env.closed == ["j/0/0"]


@pytest.mark.parametrize("finish", ["length", "unknown"])
async def test_a_cut_turn_runs_no_tool_call_and_keeps_its_reason(finish: str) -> None:
    """A turn cut by max_tokens (or one whose end nobody named) whose text holds a whole tool call:
    the call ran and the loop went on, so the rollout ended "stop" and hid that a turn was cut."""

    class CutModel(LocalModel):
        async def generate(self, call: Any) -> Any:
            return dataclasses.replace(await super().generate(call), finish_reason=finish)

    model, env = CutModel(counter_tool_script), LocalEnv()
    out = await run_agent(
        job_id="j",
        key=RolloutKey(0, 0),
        task=_task("Add 1 and 2", "3"),
        seed=0,
        settings=AgentSettings(environment="session_state", max_steps=8),
        model=model,
        env=env,
    )
    assert out.finish_reason == finish and len(out.turns) == 1 and env.tool_calls == []
    assert [m["role"] for m in out.messages] == ["assistant"] and out.messages[0]["tool_calls"]


async def test_sessions_closed_when_verify_raises() -> None:
    model, env = LocalModel(), LocalEnv()
    env.verify_errors.append(RuntimeError("verifier exploded"))
    with pytest.raises(RuntimeError):
        await run_agent(
            job_id="j",
            key=RolloutKey(0, 0),
            task=_task("What is 1 + 2?", "3"),
            seed=0,
            settings=AgentSettings(environment="arithmetic"),
            model=model,
            env=env,
        )
    assert env.closed == ["j/0/0"] and model.closed == ["j/0/0"] and not env.sessions


def test_row_overrides_tools_and_input_shapes() -> None:
    task = {
        "responses_create_params": {
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]},
                {"role": "user", "content": "hi"},
            ],
            "temperature": 0.2,
            "max_output_tokens": 5,
            "tools": [
                {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}
            ],
        }
    }
    assert row_sampling(task, {"temperature": 1.0, "top_p": 0.9}) == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 5,
    }
    assert row_tools(task) == [{"name": "f", "description": "d", "parameters": {"type": "object"}}]
    assert input_messages(task, "sys") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    plain = {"responses_create_params": {"input": "What?"}}
    assert input_messages(plain, "sys") == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "What?"},
    ]


async def test_one_turn_rollout_opens_no_gateway_session() -> None:
    model, env = LocalModel(), LocalEnv()
    out = await run_agent(
        job_id="j",
        key=RolloutKey(2, 0),
        task=_task("What is 1 + 2?", "3"),
        seed=0,
        settings=AgentSettings(environment="arithmetic", max_steps=1),
        model=model,
        env=env,
    )
    assert out.verdict.reward == 1.0 and len(out.turns) == 1
    # no session id on the model call, so nothing to close at the gateway; the verifier's is closed
    assert [c.session_id for c in model.calls] == [""] and model.calls[0].request_id == "j/2/0/0"
    assert model.closed == [] and model.open_sessions == 0
    assert env.closed == ["j/2/0"] and not env.sessions


async def test_a_turn_aborted_on_the_engine_is_retried_not_scored() -> None:
    """A generation aborted mid-answer (the gateway's Abort, an engine abort) comes back with
    finish_reason "abort" and the tokens so far: scored, "The answer is 1" of 12 was a reward and a
    token record of a cut answer. Now the attempt fails, retryable, and nothing is recorded."""
    import asyncio

    from rollmesh.gateway import Gateway
    from rollmesh.gateway.backends.fake import FakeBackend
    from rollmesh.gateway.servicer import GatewayServicer
    from rollmesh.scheduler.errors import GenerationAborted
    from rollmesh.scheduler.remote import GatewayModel
    from rollmesh.scheduler.retry import classify

    backend = FakeBackend("tiny", script=lambda prompt, request: "The answer is 12", token_latency_s=0.05)
    gateway = Gateway([backend])
    await gateway.start()
    env = LocalEnv()
    never = AssertionError("a cut answer was verified")
    env.verify_errors.append(never)
    rollout = asyncio.create_task(
        run_agent(
            job_id="j",
            key=RolloutKey(0, 0),
            task=_task("What is 5 + 7?", "12"),
            seed=0,
            settings=AgentSettings(environment="arithmetic", max_steps=1),
            model=GatewayModel.in_process(GatewayServicer(gateway)),
            env=env,
        )
    )
    try:
        await backend.wait_running("j/0/0/0")
        assert await gateway.abort("j/0/0/0")
        with pytest.raises(GenerationAborted, match=r"model turn 1 .* was aborted after") as info:
            await rollout
    finally:
        await gateway.shutdown()
    assert classify(info.value).retryable and env.verify_errors == [never]
