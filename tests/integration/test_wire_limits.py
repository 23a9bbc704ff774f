"""Bounded inputs and clear wire errors, on the real services (embedded mesh, fake model backend)
with a small message limit (`ROLLMESH_MAX_MESSAGE_MB`): an item too large for a message fails alone,
with its size and the limit, while the other items on the same GenerateMany/VerifyBatch stream are
answered (an answer too large likewise fails alone); a dataset row too large is refused at submit
naming file, line, size and limit; bytes that are not the method's protobuf message get
INVALID_ARGUMENT, not UNKNOWN."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_status import rpc_status

from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.launch import embedded_mesh
from rollmesh.scheduler.remote import GatewayModel
from rollmesh_client import Client
from rollmesh_client import InvalidArgumentError
from rollmesh_client import ResourceExhaustedError
from rollmesh_client import RollmeshClientError
from rollmesh_client import aio_channel
from rollmesh_client import max_item_bytes
from rollmesh_client import max_message_bytes
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import scheduler_pb2
from rollmesh_client.v1 import verifier_pb2
from tests.fakes import Rows

LIMIT_MB = "0.25"  # 262,144 bytes
BIG = "x" * 300_000


async def _mesh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit_mb: str
) -> AsyncIterator[dict[str, str]]:
    monkeypatch.setenv("ROLLMESH_MAX_MESSAGE_MB", limit_mb)
    spec = ModelSpec(name="fake", backend="fake", model="fake")
    cfg = GatewayConfig(models=(spec,), default_model="fake", http_port=-1)
    async with embedded_mesh(cfg, output_dir=str(tmp_path / "runs")) as m:
        yield dict(m.addresses)


@pytest_asyncio.fixture
async def mesh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, str]]:
    async for addresses in _mesh(tmp_path, monkeypatch, LIMIT_MB):
        yield addresses


@pytest_asyncio.fixture
async def tight_mesh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, str]]:
    """A 7,340-byte limit: a 3,900-character prompt fits, its answer (2 bytes per prompt token id
    with the fake tokenizer) does not."""
    async for addresses in _mesh(tmp_path, monkeypatch, "0.007"):
        yield addresses


def _verify(answer: str, expected: str = "5") -> verifier_pb2.VerifyRequest:
    return verifier_pb2.VerifyRequest(
        environment="arithmetic",
        task_json=json.dumps({"question": "What is 2 + 3?", "expected_answer": expected}),
        response=verifier_pb2.ModelResponse(messages=[{"role": "assistant", "content": answer}]),
    )


def _assert_too_large(err: Any) -> None:
    assert isinstance(err, InvalidArgumentError), err
    assert err.reason == "MESSAGE_TOO_LARGE"
    assert int(err.metadata["size"]) > 300_000 and int(err.metadata["limit"]) == max_item_bytes()
    assert "ROLLMESH_MAX_MESSAGE_MB" in err.message and f"{max_item_bytes():,}" in err.message


async def test_an_oversized_verify_item_fails_alone_on_a_shared_stream(mesh: dict[str, str]) -> None:
    assert max_message_bytes() == 262_144
    items = [(str(i), _verify("5" if i % 2 else "4")) for i in range(12)]
    items.insert(5, ("big", _verify(BIG)))
    async with await Client.connect(**mesh) as c:
        answers = dict([a async for a in c.verifier.verify_many(items, window=3, timeout_s=60)])
    assert set(answers) == {str(i) for i in range(12)} | {"big"}
    _assert_too_large(answers.pop("big"))
    assert {k: a.reward for k, a in answers.items()} == {str(i): float(i % 2) for i in range(12)}


async def test_an_oversized_generate_item_fails_alone_on_a_shared_stream(mesh: dict[str, str]) -> None:
    def request(content: str) -> gateway_pb2.GenerateRequest:
        return gateway_pb2.GenerateRequest(messages=[{"role": "user", "content": content}])

    items = [(str(i), request(f"What is {i} + 1?")) for i in range(8)]
    items.insert(3, ("big", request(BIG)))
    async with await Client.connect(**mesh) as c:
        answers = dict([a async for a in c.gateway.generate_many(items, window=4, timeout_s=60)])
    _assert_too_large(answers.pop("big"))
    assert set(answers) == {str(i) for i in range(8)}
    assert all(not isinstance(a, RollmeshClientError) and a.output_token_ids for a in answers.values())

    # The scheduler's port: the big call raises on its own, the stream it shares keeps working.
    model = GatewayModel.connect(mesh["gateway"])
    try:
        assert (await model._generate(request("What is 1 + 1?"))).output_token_ids
        with pytest.raises(InvalidArgumentError) as refused:
            await model._generate(request(BIG))
        _assert_too_large(refused.value)
        assert (await model._generate(request("What is 2 + 2?"))).output_token_ids
    finally:
        await model.close()


async def test_an_answer_too_large_fails_alone_on_a_shared_stream(tight_mesh: dict[str, str]) -> None:
    """The big item's request fits, its answer does not: it gets RESOURCE_EXHAUSTED (not retried),
    and the stream goes on for the others."""

    def request(content: str) -> gateway_pb2.GenerateRequest:
        return gateway_pb2.GenerateRequest(messages=[{"role": "user", "content": content}])

    items = [(str(i), request(f"What is {i} + 1?")) for i in range(6)]
    items.insert(2, ("big", request("x" * 3_900)))
    async with await Client.connect(**tight_mesh) as c:
        answers = dict([a async for a in c.gateway.generate_many(items, window=3, timeout_s=60)])
    refused = answers.pop("big")
    assert isinstance(refused, ResourceExhaustedError), refused
    assert refused.reason == "MESSAGE_TOO_LARGE" and refused.retry_after_s is None
    assert int(refused.metadata["size"]) > max_message_bytes() == int(refused.metadata["limit"])
    assert set(answers) == {str(i) for i in range(6)}
    assert all(not isinstance(a, RollmeshClientError) and a.output_token_ids for a in answers.values())


async def test_a_dataset_row_too_large_is_refused_at_submit(mesh: dict[str, str], tmp_path: Path) -> None:
    data = Rows.arithmetic(5).write(tmp_path / "rows.jsonl")
    lines = data.read_text().splitlines()
    big = json.loads(lines[2])
    big["padding"] = BIG
    lines[2] = json.dumps(big)
    data.write_text("\n".join(lines) + "\n")
    async with await Client.connect(**mesh) as c:
        with pytest.raises(InvalidArgumentError) as refused:
            await c.scheduler.submit(scheduler_pb2.JobSpec(dataset=str(data), environment="arithmetic"))
    err = refused.value
    assert err.reason == "DATASET_ROW_TOO_LARGE"
    assert err.metadata["path"] == str(data) and err.metadata["line"] == "3"
    assert int(err.metadata["size"]) > 300_000 and err.metadata["limit"] == str(max_item_bytes())
    assert f"{data}:3:" in err.message and "ROLLMESH_MAX_MESSAGE_MB" in err.message


async def test_a_job_row_whose_verify_request_is_too_large_fails_alone(
    mesh: dict[str, str], tmp_path: Path
) -> None:
    """A row just under the row limit passes submit, but its VerifyRequest (the row as task_json plus
    the conversation) is over the limit: that rollout fails with MESSAGE_TOO_LARGE, once (not retried),
    and every other rollout of the job, sharing the same VerifyBatch stream, succeeds."""
    data = Rows.arithmetic(6).write(tmp_path / "rows.jsonl")
    lines = data.read_text().splitlines()
    big = json.loads(lines[4])
    big["responses_create_params"]["input"][0]["content"] += " " + "x" * 2_000
    big["padding"] = ""
    big["padding"] = "p" * (max_item_bytes() - 100 - len(json.dumps(big)))
    lines[4] = json.dumps(big)
    assert max_item_bytes() - 200 < len(lines[4]) < max_item_bytes()
    data.write_text("\n".join(lines) + "\n")
    async with await Client.connect(**mesh) as c:
        spec = scheduler_pb2.JobSpec(dataset=str(data), environment="arithmetic", num_repeats=2)
        job = await c.scheduler.submit(spec)
        final = await job.result(timeout_s=120)
    assert final.progress.succeeded == 10 and final.progress.failed == 2, final
    failures = [json.loads(x) for x in (Path(final.output_path) / "failures.jsonl").read_text().splitlines()]
    assert sorted((f["task_index"], f["rollout_index"]) for f in failures) == [(4, 0), (4, 1)]
    for f in failures:
        assert "MESSAGE_TOO_LARGE" in f["error_class"] and f["attempts"] == 1, f
        assert f"{max_item_bytes():,}-byte gRPC message limit" in f["message"], f


async def _raw_call(channel: grpc.aio.Channel, path: str, kind: str) -> grpc.aio.AioRpcError:
    garbage = b"\xff\xff\xff\xff\x0f"
    try:
        if kind == "unary":
            await channel.unary_unary(path)(garbage, timeout=30)
        elif kind == "server_stream":
            async for _ in channel.unary_stream(path)(garbage, timeout=30):
                pass
        else:

            async def one() -> AsyncIterator[bytes]:
                yield garbage

            async for _ in channel.stream_stream(path)(one(), timeout=30):
                pass
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError(f"{path} took undecodable bytes")


@pytest.mark.parametrize(
    ("service", "path", "kind"),
    [
        ("verifier", "/rollmesh.v1.EnvironmentVerifier/Verify", "unary"),
        ("registry", "/rollmesh.v1.ArtifactRegistry/ReadArtifact", "server_stream"),
        ("verifier", "/rollmesh.v1.EnvironmentVerifier/VerifyBatch", "bidi"),
        ("gateway", "/rollmesh.v1.ModelGateway/GenerateMany", "bidi"),
        ("scheduler", "/rollmesh.v1.RolloutScheduler/SubmitJob", "unary"),
    ],
)
async def test_bytes_that_do_not_decode_are_invalid_argument(
    mesh: dict[str, str], service: str, path: str, kind: str
) -> None:
    async with aio_channel(mesh[service]) as ch:
        exc = await _raw_call(ch, path, kind)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
    status = rpc_status.from_call(exc)
    assert status is not None and "not a valid protobuf message" in status.message
    assert b"UNDECODABLE_REQUEST" in status.details[0].value
