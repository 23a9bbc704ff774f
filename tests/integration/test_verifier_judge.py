"""The math environment's optional LLM judge, through a fake ModelGateway over real gRPC."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from rollmesh.mesh.errors import Unavailable
from rollmesh.mesh.server import MeshServer, ServiceBinding
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier.testing import TEST_CONFIG, answer, check, load_env, task
from rollmesh_client.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

StartServer = Callable[..., Awaitable[MeshServer]]
MATH = BUILTIN_ROOT / "environments" / "math"


class FakeGateway(gateway_pb2_grpc.ModelGatewayServicer):
    def __init__(self, verdict: str | None) -> None:
        self.verdict = verdict
        self.prompts: list[str] = []

    async def Generate(
        self, request: gateway_pb2.GenerateRequest, context: Any
    ) -> gateway_pb2.GenerateResponse:
        self.prompts.append(request.messages[0].content)
        if self.verdict is None:
            raise Unavailable("no replicas", retry_after_s=1.0)
        return gateway_pb2.GenerateResponse(
            message=common_pb2.ChatMessage(role="assistant", content=self.verdict)
        )


def gateway_binding(fake: FakeGateway) -> ServiceBinding:
    return ServiceBinding.of(gateway_pb2, gateway_pb2_grpc, "ModelGateway", fake)


async def test_judge_can_rescue_an_answer(start_server: StartServer) -> None:
    fake = FakeGateway("EQUIVALENT")
    server = await start_server([gateway_binding(fake)])
    cfg = replace(TEST_CONFIG, math_judge=True, gateway_addr=server.address)
    async with load_env(MATH, cfg) as env:
        t = task("4", "Solve 2x + 3 = 11.")
        r = await check(env, t, answer("x equals four"))
        assert r.reward == 1.0 and r.components == {"symbolic": 0.0, "judge": 1.0}
        assert "Solve 2x + 3 = 11." in fake.prompts[0]
        right = await check(env, t, answer("\\boxed{4}"))
        assert right.reward == 1.0 and len(fake.prompts) == 1  # no judge when math-verify agrees


async def test_judge_failure_scores_zero_and_says_why(start_server: StartServer) -> None:
    fake = FakeGateway(None)
    server = await start_server([gateway_binding(fake)])
    cfg = replace(TEST_CONFIG, math_judge=True, gateway_addr=server.address)
    async with load_env(MATH, cfg) as env:
        r = await check(env, task("4"), answer("x equals four"))
        assert r.reward == 0.0 and "judge failed: UNAVAILABLE" in r.details["judge"]
    fake.verdict = "I think so"
    async with load_env(MATH, cfg) as env:
        r = await check(env, task("4"), answer("x equals four"))
        assert r.reward == 0.0 and "unparseable verdict" in r.details["judge"]


async def test_judge_unreachable_and_off_by_default(tmp_path: Path) -> None:
    del tmp_path
    cfg = replace(TEST_CONFIG, gateway_addr="127.0.0.1:1")
    async with load_env(MATH, cfg) as env:
        off = await check(env, task("4"), answer("x equals four"))
        assert off.reward == 0.0 and "judge" not in off.details
        on = await check(env, task("4", verifier_metadata={"use_judge": True}), answer("four"))
        assert on.reward == 0.0 and on.details["judge"].startswith("judge failed:"), on.details
    assert grpc.StatusCode.UNAVAILABLE.name in on.details["judge"] or "DEADLINE" in on.details["judge"]
