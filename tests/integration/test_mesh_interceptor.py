"""The mesh interceptor around a real server-streaming handler (ModelGateway.GenerateStream over a
FakeBackend): a client that stops reading mid-stream and cancels has the engine request aborted
(grpc.aio closes the wrapping generator at its yield; the interceptor closes the handler's own
generator with it, so the handler's `finally` runs)."""

from __future__ import annotations

from rollmesh.gateway import Gateway, binding
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh_client import aio_channel
from rollmesh_client.v1 import gateway_pb2, gateway_pb2_grpc
from tests.conftest import StartServer


async def test_a_cancelled_server_stream_aborts_the_engine_request(start_server: StartServer) -> None:
    backend = FakeBackend("tiny", token_latency_s=0.05)
    backend.script = lambda prompt, request: "a long answer " * 200
    gateway = Gateway([backend])
    await gateway.start()
    try:
        server = await start_server([binding(gateway)], api_key="k")
        async with aio_channel(server.address, api_key="k") as ch:
            request = gateway_pb2.GenerateRequest(
                messages=[{"role": "user", "content": "go"}], request_id="streamed"
            )
            call = gateway_pb2_grpc.ModelGatewayStub(ch).GenerateStream(request, timeout=60)
            got = 0
            async for _ in call:
                got += 1
                if got == 3:
                    break  # stop reading with the handler suspended at its yield
            call.cancel()
            await backend.wait_aborted("streamed", timeout_s=30)
        assert got == 3
        assert gateway.running_requests() == []
    finally:
        await gateway.shutdown()
