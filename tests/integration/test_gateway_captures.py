"""Captures over the wire: OpenCapture / CloseCapture on the gateway's gRPC server and the plain
`openai` SDK calling the capture's URL on the HTTP facade (FakeBackend, ephemeral ports, an API key
on both doors)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import httpx
import openai
import pytest
import pytest_asyncio

from rollmesh.devtools.fake_scripts import counter_agent
from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.http import HttpFacade
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh_client import aio_channel
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import gateway_pb2_grpc

KEY = "mesh-key"
TOOLS = [
    {"type": "function", "function": {"name": "increment_counter", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_counter_value", "parameters": {"type": "object"}}},
]
USER = {"role": "user", "content": "The counter starts at 0. Use the tools to add 3 to it."}


@dataclass
class Mesh:
    stub: gateway_pb2_grpc.ModelGatewayStub
    http: HttpFacade


@pytest_asyncio.fixture
async def mesh() -> AsyncIterator[Mesh]:
    gateway = Gateway([FakeBackend("tiny", script=counter_agent, max_model_len=4096)])
    await gateway.start()
    server = await build_server([ServiceBinding.of(GatewayServicer(gateway))], "127.0.0.1:0", api_key=KEY)
    await server.start()
    http = HttpFacade(gateway, host="127.0.0.1", port=0, api_key=KEY)
    await http.start()
    channel = aio_channel(server.address, api_key=KEY)
    try:
        await wait_serving(server.address, timeout_s=30)
        yield Mesh(gateway_pb2_grpc.ModelGatewayStub(channel), http)
    finally:
        await channel.close()
        await http.stop()
        await server.stop(0)
        await gateway.shutdown()


async def test_a_capture_records_a_tool_loop_stitched_token_exact(mesh: Mesh) -> None:
    opened = await mesh.stub.OpenCapture(
        gateway_pb2.OpenCaptureRequest(
            capture_id="job/0/0",
            session_id="job/0/0",
            sampling=common_pb2.SamplingParams(seed=5, logprobs=True),
        )
    )
    assert opened.base_url == f"http://127.0.0.1:{mesh.http.port}{opened.path}"
    client = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.token, max_retries=0, timeout=30)
    messages: list[dict[str, object]] = [USER]
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
        first = await client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        call = first.choices[0].message.tool_calls
        assert call and call[0].function.name == "increment_counter"
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call[0].id, "content": "3"},
        ]
        stream = await client.chat.completions.create(model="x", messages=messages, tools=TOOLS, stream=True)  # type: ignore[arg-type]
        async for _ in stream:
            pass
        with pytest.raises(openai.AuthenticationError):  # the mesh's key is not the capture's token
            bad = openai.AsyncOpenAI(base_url=opened.base_url, api_key=KEY, max_retries=0)
            await bad.chat.completions.create(model="x", messages=[USER])  # type: ignore[list-item]
    finally:
        await client.close()
    closed = await mesh.stub.CloseCapture(gateway_pb2.CloseCaptureRequest(capture_id="job/0/0"))
    assert [c.api for c in closed.calls] == ["chat.completions", "chat.completions"]
    one, two = (c.response for c in closed.calls)
    assert one.model == "tiny" and one.request_id == "job/0/0/0" and two.request_id == "job/0/0/1"
    # What each call asked for is kept: the row says a name the job does not serve was answered by "tiny".
    assert [c.requested_model for c in closed.calls] == ["gpt-4o", "x"]
    assert len(one.logprobs) == len(one.output_token_ids) > 0  # the capture's logprobs
    kept = [*one.prompt_token_ids, *one.output_token_ids]
    assert list(two.prompt_token_ids[: len(kept)]) == kept and two.reused_prefix_tokens == len(kept)
    assert [m.role for m in closed.calls[1].messages] == ["user", "assistant", "tool"]
    assert closed.calls[0].tools[0].name == "increment_counter"
    # Closed: its URL is gone, and a second close says so.
    async with httpx.AsyncClient() as h:
        gone = await h.post(
            f"{opened.base_url}/chat/completions",
            json={"model": "x", "messages": [USER]},
            headers={"Authorization": f"Bearer {opened.token}"},
        )
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "CAPTURE_NOT_FOUND"
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await mesh.stub.CloseCapture(gateway_pb2.CloseCaptureRequest(capture_id="job/0/0"))
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_responses_api_and_a_refused_call(mesh: Mesh) -> None:
    opened = await mesh.stub.OpenCapture(gateway_pb2.OpenCaptureRequest(capture_id="c", session_id="s"))
    client = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.token, max_retries=0, timeout=30)
    try:
        reply = await client.responses.create(
            model="x",
            input=[USER],
            tools=[
                {
                    "type": "function",
                    "name": "increment_counter",
                    "parameters": {"type": "object"},
                    "strict": False,
                }
            ],
        )  # type: ignore[list-item]
        assert [i.type for i in reply.output] == ["function_call"]
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="x", messages=[USER], n=2)  # type: ignore[list-item]
    finally:
        await client.close()
    closed = await mesh.stub.CloseCapture(gateway_pb2.CloseCaptureRequest(capture_id="c"))
    assert [c.api for c in closed.calls] == ["responses"] and closed.refused_calls == 1


async def test_a_gateway_without_its_http_facade_opens_no_capture(mesh: Mesh) -> None:
    await mesh.http.stop()
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await mesh.stub.OpenCapture(gateway_pb2.OpenCaptureRequest(capture_id="c"))
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "CAPTURE_NO_HTTP" in str(
        exc.value.trailing_metadata()
    )
