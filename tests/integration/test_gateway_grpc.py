"""A real ModelGateway gRPC server (FakeBackend) on loopback, through the SDK's GatewayClient."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.remote import GatewayModel
from rollmesh_client import Client
from rollmesh_client import RollmeshClientError
from rollmesh_client._gateway import sampling_params
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import gateway_pb2_grpc
from tests.conftest import StartServer
from tests.fakes import FakeGateway

USER = [{"role": "user", "content": "what is 5+7?"}]


class Mesh:
    def __init__(self, client: Client, backend: FakeBackend, gateway: Gateway, address: str) -> None:
        self.client, self.backend, self.gateway, self.address = client, backend, gateway, address


@pytest_asyncio.fixture
async def mesh(start_server: StartServer) -> AsyncIterator[Mesh]:
    backend = FakeBackend("tiny", num_replicas=2, max_model_len=256)
    gateway = Gateway([backend])
    await gateway.start()
    server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    client = await Client.connect(gateway=server.address, timeout_s=10)
    try:
        yield Mesh(client, backend, gateway, server.address)
    finally:
        await client.close()
        await gateway.shutdown()


async def test_generate(mesh: Mesh) -> None:
    r = await mesh.client.gateway.generate(
        USER, sampling=sampling_params(temperature=0, logprobs=True), session_id="s1", request_id="g1"
    )
    assert r.message.role == "assistant" and r.message.content == "what is 5+7?"
    assert r.finish_reason == "stop" and r.request_id == "g1" and r.model == "tiny"
    assert FakeTokenizer().decode(list(r.output_token_ids)) == "what is 5+7?<|end|>"
    assert len(r.logprobs) == len(r.output_token_ids) > 0
    assert r.usage.total_tokens == len(r.prompt_token_ids) + len(r.output_token_ids)
    assert r.replica_id == mesh.backend.pick_replica("s1")
    models = [m async for m in mesh.client.gateway.models()]
    assert [(m.name, m.is_default, len(m.replicas)) for m in models] == [("tiny", True, 2)]
    assert sum(rep.sessions for rep in models[0].replicas) == 1


async def test_generate_stream(mesh: Mesh) -> None:
    mesh.backend.script = lambda p, r: 'ok <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    items = [x async for x in mesh.client.gateway.generate_stream(USER, tools=[{"name": "add"}])]
    assert items[-1].HasField("final")
    assert all(not x.HasField("final") for x in items[:-1])
    streamed = [t for x in items[:-1] for t in x.token_ids]
    final = items[-1].final
    assert streamed == list(final.output_token_ids)
    assert final.finish_reason == "tool_calls"
    assert final.message.content == "ok "
    assert [(c.name, c.arguments_json) for c in final.message.tool_calls] == [("add", '{"a": 1}')]


async def test_abort_and_policy_version(mesh: Mesh) -> None:
    mesh.backend.token_latency_s = 60
    assert await mesh.client.gateway.set_policy_version("step-3") == "0"
    task = asyncio.create_task(mesh.client.gateway.generate(USER, request_id="long"))
    await mesh.backend.wait_running("long")
    assert await mesh.client.gateway.abort("long") is True
    r = await task
    assert (r.finish_reason, r.policy_version) == ("abort", "step-3")
    assert await mesh.client.gateway.abort("long") is False


async def test_client_cancel_aborts_the_engine_request(mesh: Mesh) -> None:
    mesh.backend.token_latency_s = 60
    task = asyncio.create_task(mesh.client.gateway.generate(USER, request_id="gone"))
    await mesh.backend.wait_running("gone")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await mesh.backend.wait_aborted("gone")  # the server learns of the cancel asynchronously
    assert mesh.gateway.running_requests() == []


async def test_deadline_propagates(mesh: Mesh) -> None:
    mesh.backend.token_latency_s = 60
    with pytest.raises(RollmeshClientError) as exc:
        await mesh.client.gateway.generate(USER, request_id="late", timeout_s=0.5)
    assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.fixture
def server_address(mesh: Mesh) -> str:
    return mesh.address


@pytest.mark.parametrize(
    ("kwargs", "code", "reason"),
    [
        ({"model": "nope"}, grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
        (
            {"sampling": sampling_params(temperature=-1)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_SAMPLING_PARAMS",
        ),
        ({"sampling": sampling_params(top_p=2)}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SAMPLING_PARAMS"),
        (
            {"sampling": sampling_params(max_tokens=0)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_SAMPLING_PARAMS",
        ),
        (
            {"sampling": sampling_params(max_tokens=257)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_SAMPLING_PARAMS",
        ),
        (
            {"messages": [{"role": "user", "content": "x" * 300}]},
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "PROMPT_TOO_LONG",
        ),
    ],
)
async def test_errors_over_the_wire(
    mesh: Mesh, kwargs: dict[str, object], code: grpc.StatusCode, reason: str
) -> None:
    messages = kwargs.pop("messages", USER)
    with pytest.raises(RollmeshClientError) as exc:
        await mesh.client.gateway.generate(messages, **kwargs)  # type: ignore[arg-type]
    assert (exc.value.code, exc.value.reason) == (code, reason)


async def test_backend_down_is_unavailable_with_retry_info(mesh: Mesh) -> None:
    mesh.backend.down, mesh.backend.retry_after_s = True, 3.0
    with pytest.raises(RollmeshClientError) as exc:
        await mesh.client.gateway.generate(USER)
    assert (exc.value.code, exc.value.reason) == (grpc.StatusCode.UNAVAILABLE, "BACKEND_UNAVAILABLE")
    assert exc.value.retry_after_s == 3.0 and exc.value.retryable


async def test_admin_rpcs(mesh: Mesh) -> None:
    gw = mesh.client.gateway
    info = await gw.register_route("job-1", target_model="tiny")
    assert info.name == "job-1" and info.backend == "fake"
    r = await gw.generate(USER, model="job-1", session_id="s")
    assert r.model == "tiny"
    assert await gw.close_session("s") is True
    await gw.pause()
    assert [m.paused async for m in gw.models()] == [True, True]
    with pytest.raises(RollmeshClientError) as exc:
        await gw.generate(USER, timeout_s=0.3)
    assert exc.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    await gw.resume()
    assert (await gw.generate(USER)).finish_reason == "stop"
    with pytest.raises(RollmeshClientError) as exc:
        await gw.register_route("job-1", target_model="missing")
    assert (exc.value.code, exc.value.reason) == (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND")


# ---- GenerateMany: many generations over one stream (what the scheduler uses) ------------------


def _turn_call(i: int, **sampling: object) -> GenerateCall:
    return GenerateCall(
        model="",
        messages=[{"role": "user", "content": f"what is {i}+1?"}],
        tools=[],
        sampling={"temperature": 0, **sampling},
        session_id="",
        request_id=f"many-{i}",
    )


async def test_generate_many_answers_each_call_over_one_stream(mesh: Mesh, server_address: str) -> None:
    model = GatewayModel.connect(server_address)
    try:
        turns = await asyncio.gather(*(model.generate(_turn_call(i)) for i in range(100)))
    finally:
        await model.close()
    assert [t.message["content"] for t in turns] == [f"what is {i}+1?" for i in range(100)]
    assert all(t.output_token_ids and t.finish_reason == "stop" for t in turns)
    assert mesh.gateway.running_requests() == []


async def test_generate_many_item_errors_keep_code_and_reason(mesh: Mesh, server_address: str) -> None:
    model = GatewayModel.connect(server_address)
    try:
        with pytest.raises(RollmeshClientError) as exc:
            await model.generate(_turn_call(1, max_tokens=0))
        assert (exc.value.code, exc.value.reason) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_SAMPLING_PARAMS",
        )
        assert exc.value.metadata["field"] == "sampling.max_tokens"
        mesh.backend.down, mesh.backend.retry_after_s = True, 2.0
        with pytest.raises(RollmeshClientError) as down:
            await model.generate(_turn_call(2))
        assert down.value.code == grpc.StatusCode.UNAVAILABLE and down.value.retry_after_s == 2.0
        mesh.backend.down = False
        assert (await model.generate(_turn_call(3))).finish_reason == "stop"  # the stream went on
    finally:
        await model.close()


async def test_generate_many_cancel_and_deadline_abort_the_engine_request(
    mesh: Mesh, server_address: str
) -> None:
    mesh.backend.token_latency_s = 60
    model = GatewayModel.connect(server_address)
    try:
        # The job's deadline (the scheduler's attempt or adaptive model-call deadline) cuts the call.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await model.generate(_turn_call(7))
        await mesh.backend.wait_aborted("many-7")
        task = asyncio.create_task(model.generate(_turn_call(8)))
        await mesh.backend.wait_running("many-8")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await mesh.backend.wait_aborted("many-8")
    finally:
        await model.close()
    assert mesh.gateway.running_requests() == []


async def test_a_gateway_without_generate_many_gets_unary_generate(start_server: StartServer) -> None:
    """An older gateway serves only unary Generate (GenerateMany is UNIMPLEMENTED): calls fall back."""
    fake = FakeGateway()

    def add_generate_only(servicer: FakeGateway, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            servicer.Generate,
            request_deserializer=gateway_pb2.GenerateRequest.FromString,
            response_serializer=gateway_pb2.GenerateResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("rollmesh.v1.ModelGateway", {"Generate": handler}),)
        )

    server = await start_server([ServiceBinding("rollmesh.v1.ModelGateway", fake, add_generate_only)])
    model = GatewayModel.connect(server.address)
    try:
        turns = await asyncio.gather(*(model.generate(_turn_call(i)) for i in range(3)))
        assert len(turns) == 3 and fake.generated == 3
        assert (await model.generate(_turn_call(4))).finish_reason == "stop"
    finally:
        await model.close()
    assert fake.generated == 4


async def test_generate_many_answers_an_item_with_no_request_instead_of_dropping_it(
    server_address: str,
) -> None:
    """An item with neither `request` nor `cancel` got no answer: its caller waited forever."""
    hi = gateway_pb2.GenerateRequest(messages=[{"role": "user", "content": "hi"}])
    items = [
        gateway_pb2.GenerateManyRequest(id="empty"),
        gateway_pb2.GenerateManyRequest(id="ok", request=hi),
    ]
    async with grpc.aio.insecure_channel(server_address) as channel:
        call = gateway_pb2_grpc.ModelGatewayStub(channel).GenerateMany(iter(items), timeout=30)
        answers = {a.id: a async for a in call}
    assert answers["ok"].HasField("response")
    assert answers["empty"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "needs a request (or cancel: true)" in answers["empty"].error.message
