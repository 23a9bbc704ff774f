"""The scheduler's ports give model, tool, step and verify calls no deadline of their own: the job bounds
them (`rollout_timeout_s`, the adaptive model-call deadline). A fixed cap here cut every model call at
300 s and every verification at 120 s whatever the job's `rollout_timeout_s` said."""

from __future__ import annotations

from typing import Any

from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.remote import SERVICE_CALL_S
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import verifier_pb2


class _Recorder:
    """A stub's methods and a multiplexed caller in one, recording each call's deadline."""

    def __init__(self) -> None:
        self.deadlines: dict[str, float | None] = {}

    def __getattr__(self, method: str) -> Any:
        answers = {
            "Generate": gateway_pb2.GenerateResponse(message=common_pb2.ChatMessage(role="assistant")),
            "CallTool": verifier_pb2.CallToolResponse(output="ok"),
            "Step": verifier_pb2.StepResponse(done=True),
            "SeedSession": verifier_pb2.SeedSessionResponse(),
            "CloseSession": verifier_pb2.CloseSessionResponse(),
        }

        async def unary(request: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109 (a stub)
            self.deadlines[method] = timeout
            return answers[method]

        return unary

    async def call(self, payload: Any, deadline_s: float | None) -> Any:
        self.deadlines[type(payload).__name__] = deadline_s
        if isinstance(payload, gateway_pb2.GenerateRequest):
            return gateway_pb2.GenerateResponse(message=common_pb2.ChatMessage(role="assistant"))
        return verifier_pb2.VerifyResult(reward=1.0)

    async def close(self) -> None:
        pass


async def test_model_tool_and_verify_calls_carry_no_deadline_of_their_own() -> None:
    rec = _Recorder()
    model, env = GatewayModel(rec, rec), VerifierEnv(rec, rec)
    call = GenerateCall("", [{"role": "user", "content": "1 + 1?"}], [], {}, "s", "r")
    await model.generate(call)
    model._unary_only = True  # a gateway without GenerateMany: unary Generate, no deadline either
    await model.generate(call)
    await env.call_tool("s", {"id": "1", "function": {"name": "add", "arguments": "{}"}})
    await env.step("s", [{"role": "assistant", "content": "2"}])
    await env.verify("arithmetic", {"expected_answer": "2"}, [{"role": "assistant", "content": "2"}], "s")
    await env.seed_session("arithmetic", {}, "s")
    await env.close_session("s")
    assert rec.deadlines == {
        "GenerateRequest": None,
        "Generate": None,
        "CallTool": None,
        "Step": None,
        "VerifyRequest": None,
        "SeedSession": SERVICE_CALL_S,
        "CloseSession": SERVICE_CALL_S,
    }
