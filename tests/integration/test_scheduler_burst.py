"""A burst of concurrent calls to one mesh server: every call is served.

grpc core cancels calls that arrived but the application has not picked up yet once more than
`grpc.server.max_pending_requests` (default 1000) wait, and grpc.aio picks them up one at a time, so
a scheduler with thousands of rollouts in flight saw ~20% CANCELLED with the defaults. The mesh
server raises those limits (mesh/server.py SERVER_OPTIONS).
"""

from __future__ import annotations

import asyncio
import collections

import grpc

from rollmesh_client import aio_channel
from rollmesh_client.v1 import verifier_pb2
from rollmesh_client.v1 import verifier_pb2_grpc
from tests.conftest import StartServer
from tests.fakes import FakeVerifier

BURST = 3000


async def test_a_burst_of_concurrent_calls_is_never_cancelled(start_server: StartServer) -> None:
    verifier = FakeVerifier()
    server = await start_server([verifier.binding()])
    codes: collections.Counter[str] = collections.Counter()

    async with aio_channel(server.address) as channel:
        stub = verifier_pb2_grpc.EnvironmentVerifierStub(channel)

        async def seed(i: int) -> None:
            req = verifier_pb2.SeedSessionRequest(
                environment="arithmetic", task_json="{}", session_id=f"s{i}"
            )
            try:
                await stub.SeedSession(req, timeout=120)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1

        await asyncio.gather(*(seed(i) for i in range(BURST)))

    assert codes == {"OK": BURST}
    assert verifier.seeded == BURST
