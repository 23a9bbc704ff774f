"""The mesh interceptor around a real server-streaming handler (ModelGateway.GenerateStream over a
FakeBackend): a client that stops reading mid-stream and cancels has the engine request aborted
(grpc.aio closes the wrapping generator at its yield; the interceptor closes the handler's own
generator with it, so the handler's `finally` runs); errors raised by unary and streaming handlers
become their status (a domain error's code and ErrorInfo; anything else INTERNAL, short message)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.errors import NotFound
from rollmesh.mesh.server import ServiceBinding
from rollmesh_client import Client
from rollmesh_client import InternalError
from rollmesh_client import NotFoundError
from rollmesh_client import aio_channel
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import gateway_pb2_grpc
from rollmesh_client.v1 import registry_pb2
from rollmesh_client.v1 import registry_pb2_grpc
from tests.conftest import StartServer


async def test_a_cancelled_server_stream_aborts_the_engine_request(start_server: StartServer) -> None:
    backend = FakeBackend("tiny", token_latency_s=0.05)
    backend.script = lambda prompt, request: "a long answer " * 200
    gateway = Gateway([backend])
    await gateway.start()
    try:
        server = await start_server([ServiceBinding.of(GatewayServicer(gateway))], api_key="k")
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


class _Failing(registry_pb2_grpc.ArtifactRegistryServicer):
    """ListRoots raises a plain exception; ResolveArtifact a domain error; ReadArtifact sends one
    chunk, then raises a domain error."""

    async def ListRoots(self, request: Any, context: Any) -> Any:
        raise RuntimeError("a bug")

    async def ResolveArtifact(self, request: Any, context: Any) -> Any:
        raise NotFound("no such thing", reason="ARTIFACT_NOT_FOUND", metadata={"name": request.name})

    async def ReadArtifact(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield registry_pb2.ReadArtifactResponse(data=b"first")
        raise NotFound("gone mid-stream", reason="ARTIFACT_NOT_FOUND")


async def test_errors_map_to_statuses_for_unary_and_streaming_calls(start_server: StartServer) -> None:
    binding = ServiceBinding.of(_Failing())
    server = await start_server([binding], api_key="k")
    async with await Client.connect(registry=server.address, api_key="k") as c:
        with pytest.raises(InternalError) as internal:
            await c.registry.roots()
        assert internal.value.message == "internal error; see the server log"  # no traceback leaks
        with pytest.raises(NotFoundError) as missing:
            await c.registry.resolve("dataset", "x")
        assert missing.value.reason == "ARTIFACT_NOT_FOUND" and missing.value.metadata == {"name": "x"}
        got: list[bytes] = []
        with pytest.raises(NotFoundError) as mid_stream:
            async for chunk in c.registry.read("dataset", "x"):
                got.append(chunk.data)
        assert got == [b"first"] and mid_stream.value.message == "gone mid-stream"
