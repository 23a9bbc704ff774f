"""Batch messages on the multiplexed streams (GenerateMany, VerifyBatch), against real servers: a server
says in its initial metadata that it reads batches, answers every item of a batch, batches its answers
only for a caller that asked (`rollmesh-batch: 1`), and a caller that did not ask (an older SDK) gets
one plain message per answer. The SDK's writer coalesces what waits in its outbox; `batch_messages`
keeps each message under the limit and the order of the items."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import BATCH_METADATA
from rollmesh_client import batch_messages
from rollmesh_client import items_of
from rollmesh_client import says_batches
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import gateway_pb2_grpc
from rollmesh_client.v1 import verifier_pb2
from rollmesh_client.v1 import verifier_pb2_grpc
from tests.conftest import StartServer


def _generate_item(i: int) -> gateway_pb2.GenerateManyRequest:
    request = gateway_pb2.GenerateRequest(
        messages=[common_pb2.ChatMessage(role="user", content=f"what is {i}+1?")],
        sampling=common_pb2.SamplingParams(temperature=0),
        request_id=f"batch-{i}",
    )
    return gateway_pb2.GenerateManyRequest(id=str(i), request=request, timeout_s=60)


def _call(i: int) -> GenerateCall:
    return GenerateCall(
        model="",
        messages=[{"role": "user", "content": f"what is {i}+1?"}],
        tools=[],
        sampling={"temperature": 0},
        session_id="",
        request_id=f"coalesced-{i}",
    )


async def _one_message(message: object) -> AsyncIterator[object]:
    yield message


async def _gateway(start_server: StartServer) -> tuple[Gateway, str]:
    gateway = Gateway([FakeBackend("tiny", num_replicas=2, max_model_len=256)])
    await gateway.start()
    server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    return gateway, server.address


async def test_a_batch_of_generations_is_answered_in_batches_for_a_caller_that_asked(
    start_server: StartServer,
) -> None:
    gateway, address = await _gateway(start_server)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = gateway_pb2_grpc.ModelGatewayStub(channel)
            envelope = gateway_pb2.GenerateManyRequest(batch=[_generate_item(i) for i in range(40)])
            call = stub.GenerateMany(_one_message(envelope), metadata=(BATCH_METADATA,), timeout=60)
            assert says_batches(await call.initial_metadata())
            messages = [m async for m in call]
        answers = {a.id: a for m in messages for a in items_of(m)}
        assert sorted(answers, key=int) == [str(i) for i in range(40)]
        assert all(answers[str(i)].response.message.content == f"what is {i}+1?" for i in range(40))
        # 40 instant generations finish together: their answers share messages.
        assert len(messages) < 40 and any(len(m.batch) > 1 for m in messages)
    finally:
        await gateway.shutdown()


async def test_a_caller_that_did_not_ask_gets_one_plain_message_per_answer(start_server: StartServer) -> None:
    gateway, address = await _gateway(start_server)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = gateway_pb2_grpc.ModelGatewayStub(channel)

            async def singles() -> AsyncIterator[gateway_pb2.GenerateManyRequest]:
                for i in range(20):
                    yield _generate_item(i)

            messages = [m async for m in stub.GenerateMany(singles(), timeout=60)]
        assert len(messages) == 20 and all(len(m.batch) == 0 for m in messages)
        assert sorted((m.id for m in messages), key=int) == [str(i) for i in range(20)]
        assert all(m.response.message.content for m in messages)
    finally:
        await gateway.shutdown()


async def test_a_cancel_inside_a_batch_aborts_its_generation(start_server: StartServer) -> None:
    backend = FakeBackend("tiny", num_replicas=1, max_model_len=256)
    backend.token_latency_s = 60
    gateway = Gateway([backend])
    await gateway.start()
    server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = gateway_pb2_grpc.ModelGatewayStub(channel)
            outbox: asyncio.Queue[gateway_pb2.GenerateManyRequest | None] = asyncio.Queue()

            async def requests() -> AsyncIterator[gateway_pb2.GenerateManyRequest]:
                while (m := await outbox.get()) is not None:
                    yield m

            call = stub.GenerateMany(requests(), metadata=(BATCH_METADATA,), timeout=60)
            outbox.put_nowait(gateway_pb2.GenerateManyRequest(batch=[_generate_item(1), _generate_item(2)]))
            await backend.wait_running("batch-1")
            await backend.wait_running("batch-2")
            cancels = [gateway_pb2.GenerateManyRequest(id=str(i), cancel=True) for i in (1, 2)]
            outbox.put_nowait(gateway_pb2.GenerateManyRequest(batch=cancels))
            await backend.wait_aborted("batch-1")
            await backend.wait_aborted("batch-2")
            outbox.put_nowait(None)
            assert [m async for m in call] == []  # a cancelled item gets no answer
        assert gateway.running_requests() == []
    finally:
        await gateway.shutdown()


async def test_the_sdk_mux_answers_every_caller_against_a_batching_gateway(start_server: StartServer) -> None:
    gateway, address = await _gateway(start_server)
    model = GatewayModel.connect(address)
    try:
        calls = [
            GenerateCall(
                model="",
                messages=[{"role": "user", "content": f"what is {i}+1?"}],
                tools=[],
                sampling={"temperature": 0},
                session_id="",
                request_id=f"mux-{i}",
            )
            for i in range(300)
        ]
        turns = await asyncio.gather(*(model.generate(c) for c in calls))
        assert [t.message["content"] for t in turns] == [f"what is {i}+1?" for i in range(300)]
    finally:
        await model.close()
        await gateway.shutdown()


async def test_the_sdk_writer_coalesces_calls_that_are_ready_together(start_server: StartServer) -> None:
    """Once the stream's initial metadata said `rollmesh-batch: 1`, calls sent in one loop turn leave
    as one (or a few) batch messages, not one message each."""
    gateway = Gateway([FakeBackend("tiny", num_replicas=2, max_model_len=256)])
    await gateway.start()
    received = {"messages": 0, "items": 0}

    class Counting(GatewayServicer):
        async def GenerateMany(
            self, request_iterator: AsyncIterator[gateway_pb2.GenerateManyRequest], context: Any
        ) -> AsyncIterator[gateway_pb2.GenerateManyResponse]:
            async def counted() -> AsyncIterator[gateway_pb2.GenerateManyRequest]:
                async for message in request_iterator:
                    received["messages"] += 1
                    received["items"] += len(items_of(message))
                    yield message

            async for answer in super().GenerateMany(counted(), context):
                yield answer

    server = await start_server([ServiceBinding.of(Counting(gateway))])
    model = GatewayModel.connect(server.address)
    try:
        await model.generate(_call(0))  # opens the stream; its initial metadata says batches
        received.update(messages=0, items=0)
        turns = await asyncio.gather(*(model.generate(_call(i)) for i in range(1, 201)))
        assert [t.message["content"] for t in turns] == [f"what is {i}+1?" for i in range(1, 201)]
        assert received["items"] == 200
        assert received["messages"] <= 10, received  # 200 calls ready in one turn: batches
    finally:
        await model.close()
        await gateway.shutdown()


async def test_the_verifier_reads_and_writes_batches(start_server: StartServer, tmp_path: Path) -> None:
    cfg = replace(VerifierConfig(), max_sessions=4)
    roots = RootsConfig(tmp_path, (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(cfg, Catalog.from_config(roots), entry_points=False)
    await svc.start()
    server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
    try:

        def item(i: int, answer: str) -> verifier_pb2.VerifyBatchRequest:
            task = {"responses_create_params": {"input": f"{i} + 1?"}, "expected_answer": str(i + 1)}
            request = verifier_pb2.VerifyRequest(
                environment="arithmetic",
                task_json=json.dumps(task),
                response=verifier_pb2.ModelResponse(
                    messages=[common_pb2.ChatMessage(role="assistant", content=answer)]
                ),
            )
            return verifier_pb2.VerifyBatchRequest(id=str(i), request=request)

        answers = [str(i + 1) if i % 2 else "no idea" for i in range(30)]
        envelope = verifier_pb2.VerifyBatchRequest(batch=[item(i, a) for i, a in enumerate(answers)])
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = verifier_pb2_grpc.EnvironmentVerifierStub(channel)
            call = stub.VerifyBatch(_one_message(envelope), metadata=(BATCH_METADATA,), timeout=60)
            assert says_batches(await call.initial_metadata())
            results = {r.id: r for m in [m async for m in call] for r in items_of(m)}
        assert [results[str(i)].result.reward for i in range(30)] == [float(i % 2) for i in range(30)]

        env = VerifierEnv.connect(server.address)  # the SDK's mux, batching both ways
        try:
            task = {"responses_create_params": {"input": "2 + 2?"}, "expected_answer": "4"}
            verdicts = await asyncio.gather(
                *(
                    env.verify("arithmetic", task, [{"role": "assistant", "content": "4"}], "")
                    for _ in range(200)
                )
            )
            assert all(v.reward == 1.0 for v in verdicts)
        finally:
            await env.close()
    finally:
        await svc.aclose()


def test_batch_messages_stay_under_the_limit_and_keep_the_order() -> None:
    items = [gateway_pb2.GenerateManyResponse(id=str(i)) for i in range(10)]
    sizes = [m.ByteSize() for m in items]
    limit = 3 * (max(sizes) + 8)  # room for three items per batch
    batches = batch_messages(items, sizes, limit)
    assert all(m.ByteSize() <= limit for m in batches)
    assert [a.id for m in batches for a in items_of(m)] == [str(i) for i in range(10)]
    assert len(batches) == 4  # 3 + 3 + 3 + 1, the last one a plain message
    assert len(batches[-1].batch) == 0 and batches[-1].id == "9"
    assert batch_messages(items[:1], sizes[:1], limit) == items[:1]  # one item is never wrapped
