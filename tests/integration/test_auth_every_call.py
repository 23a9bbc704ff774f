"""Bearer auth on the real services (embedded mesh: every service on its own loopback port, fake
model backend): every RPC of every service, streaming ones included, answers with the key and is
UNAUTHENTICATED without it or with a wrong one; health and reflection answer anyone; the SDK,
the scheduler's own calls, the CLI's streaming commands and the trainer's sink server all carry it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc

from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.launch import embedded_mesh
from rollmesh.scheduler.remote import GatewayModel
from rollmesh_client import Client
from rollmesh_client import UnauthenticatedError
from rollmesh_client import aio_channel
from rollmesh_client.trainer import SinkServer
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import registry_pb2
from rollmesh_client.v1 import scheduler_pb2
from rollmesh_client.v1 import sink_pb2
from rollmesh_client.v1 import verifier_pb2
from tests.procs import run_cli

KEY = "s3cret-key"
SERVICES = {
    "registry": registry_pb2.DESCRIPTOR.services_by_name["ArtifactRegistry"],
    "verifier": verifier_pb2.DESCRIPTOR.services_by_name["EnvironmentVerifier"],
    "gateway": gateway_pb2.DESCRIPTOR.services_by_name["ModelGateway"],
    "scheduler": scheduler_pb2.DESCRIPTOR.services_by_name["RolloutScheduler"],
}
RPC_TIMEOUT_S = 30.0
EXAMPLE_TRAINER = Path(__file__).resolve().parents[2] / "examples" / "trainer_loop.py"


@pytest_asyncio.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    spec = ModelSpec(name="fake", backend="fake", model="fake")
    cfg = GatewayConfig(models=(spec,), default_model="fake", http_port=-1)
    async with embedded_mesh(cfg, output_dir=str(tmp_path / "runs"), api_key=KEY) as m:
        yield dict(m.addresses)


async def _call_any(channel: grpc.aio.Channel, service: Any, method: Any) -> grpc.StatusCode:
    """Call `method` with an empty request, or for client-streaming ones a stream half-closed with no
    message (a message written while the server refuses the call races the refusal: grpc may report
    INTERNAL for the write instead of the server's status; the SDK's stream clients ask first)."""
    path = f"/{service.full_name}/{method.name}"
    req_cls = message_factory.GetMessageClass(method.input_type)
    resp_cls = message_factory.GetMessageClass(method.output_type)
    kw: dict[str, Any] = {
        "request_serializer": lambda m: m.SerializeToString(),
        "response_deserializer": resp_cls.FromString,
    }

    async def none() -> AsyncIterator[Any]:
        return
        yield

    try:
        if method.client_streaming and method.server_streaming:
            async for _ in channel.stream_stream(path, **kw)(none(), timeout=RPC_TIMEOUT_S):
                pass
        elif method.client_streaming:
            await channel.stream_unary(path, **kw)(none(), timeout=RPC_TIMEOUT_S)
        elif method.server_streaming:
            async for _ in channel.unary_stream(path, **kw)(req_cls(), timeout=RPC_TIMEOUT_S):
                pass
        else:
            await channel.unary_unary(path, **kw)(req_cls(), timeout=RPC_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_every_rpc_needs_the_key_and_answers_with_it(mesh: dict[str, str]) -> None:
    streaming_seen = 0
    for name, service in SERVICES.items():
        address = mesh[name]
        for method in service.methods:
            if method.name in ("PauseGeneration",):
                continue  # pausing with the key would hold the rest of the test; checked without it below
            streaming_seen += method.client_streaming or method.server_streaming
            for bad in (None, "wrong-key"):
                async with aio_channel(address, api_key=bad) as ch:
                    code = await _call_any(ch, service, method)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (name, method.name, bad)
            async with aio_channel(address, api_key=KEY) as ch:
                code = await _call_any(ch, service, method)
            # An empty request may be refused (NOT_FOUND, INVALID_ARGUMENT ...) but never for the token.
            assert code not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.DEADLINE_EXCEEDED), (
                name,
                method.name,
                code,
            )
    assert streaming_seen >= 5  # GenerateStream, GenerateMany, VerifyBatch, ReadArtifact, StreamRollouts
    gateway = SERVICES["gateway"]
    async with aio_channel(mesh["gateway"]) as ch:
        code = await _call_any(ch, gateway, gateway.methods_by_name["PauseGeneration"])
    assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_health_and_reflection_answer_without_a_key(mesh: dict[str, str]) -> None:
    for name, service in SERVICES.items():
        async with aio_channel(mesh[name]) as ch:
            health = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service.full_name), timeout=RPC_TIMEOUT_S
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING

            async def ask() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
                yield reflection_pb2.ServerReflectionRequest(list_services="")

            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            answers = [a async for a in stub.ServerReflectionInfo(ask(), timeout=RPC_TIMEOUT_S)]
        listed = {s.name for s in answers[0].list_services_response.service}
        assert service.full_name in listed, name


async def test_streaming_calls_work_through_the_sdk_with_the_key(mesh: dict[str, str]) -> None:
    async with await Client.connect(**mesh, api_key=KEY) as c:
        # ReadArtifact (server streaming)
        data = b"".join([chunk.data async for chunk in c.registry.read("dataset", "arithmetic")])
        assert data.count(b"\n") > 10
        # GenerateStream (server streaming)
        deltas = [d async for d in c.gateway.generate_stream([{"role": "user", "content": "What is 2 + 3?"}])]
        assert deltas[-1].final
        # VerifyBatch (bidi)
        req = verifier_pb2.VerifyRequest(
            environment="arithmetic",
            task_json=json.dumps({"question": "What is 2 + 3?", "expected_answer": "5"}),
            response=verifier_pb2.ModelResponse(),
        )
        answers = [a async for a in c.verifier.verify_batch([("a", req)])]
        assert [a.id for a in answers] == ["a"]
        # A whole job: the scheduler calls the gateway (GenerateMany) and the verifier (VerifyBatch)
        # with the mesh's key; StreamRollouts (job.rollouts()) follows it.
        job = await c.scheduler.submit(scheduler_pb2.JobSpec(benchmark="arithmetic", limit=3, num_repeats=2))
        keys = [(r.rollout.key.task_index, r.rollout.key.rollout_index) async for r in job.rollouts()]
        final = await job.result(timeout_s=120)
        assert final.state == scheduler_pb2.JOB_STATE_SUCCEEDED, final.error
        assert final.progress.failed == 0 and final.progress.succeeded == 6
        assert sorted(keys) == [(t, i) for t in range(3) for i in range(2)]

    # GenerateMany through the scheduler's own port, and without the key: every call fails with it.
    model = GatewayModel.connect(mesh["gateway"], api_key=KEY)
    anon = GatewayModel.connect(mesh["gateway"])
    try:
        req = gateway_pb2.GenerateRequest(messages=[{"role": "user", "content": "What is 1 + 1?"}])
        assert (await model._generate(req)).output_token_ids
        with pytest.raises(UnauthenticatedError):
            await anon._generate(req)
    finally:
        await model.close()
        await anon.close()


async def test_sdk_streaming_calls_without_the_key_are_unauthenticated(mesh: dict[str, str]) -> None:
    for key in (None, "wrong-key"):
        async with await Client.connect(**mesh, api_key=key) as c:
            with pytest.raises(UnauthenticatedError):
                [chunk async for chunk in c.registry.read("dataset", "arithmetic")]
            with pytest.raises(UnauthenticatedError):
                [a async for a in c.verifier.verify_batch([])]
            with pytest.raises(UnauthenticatedError):
                [r async for r in c.scheduler.stream("no-such-job")]


async def test_cli_streaming_commands_carry_the_key(mesh: dict[str, str], tmp_path: Path) -> None:
    async with await Client.connect(**mesh, api_key=KEY) as c:
        job = await c.scheduler.submit(scheduler_pb2.JobSpec(benchmark="arithmetic", limit=2, num_repeats=2))
        final = await job.result(timeout_s=120)
    assert final.state == scheduler_pb2.JOB_STATE_SUCCEEDED, final.error
    env = {"ROLLMESH_API_KEY": KEY}
    stream_args = ("jobs", "stream", job.job_id, "--no-follow", "--scheduler", mesh["scheduler"])
    code, out, err = await run_cli(*stream_args, env=env)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 4

    rollouts = Path(final.output_path) / "rollouts.jsonl"
    rescored = tmp_path / "rescored.jsonl"
    reverify_args = ("reverify", str(rollouts), "-e", "arithmetic", "--verifier", mesh["verifier"])
    code, _, err = await run_cli(*reverify_args, "--out", str(rescored), env=env)
    assert code == 0, err
    rows = [json.loads(line) for line in rescored.read_text().splitlines()]
    assert len(rows) == 4 and not any("reverify_error" in r for r in rows)

    code, _, err = await run_cli(*stream_args, env={"ROLLMESH_API_KEY": "wrong-key"})
    assert code != 0 and "UNAUTHENTICATED" in err.upper()
    code, _, err = await run_cli(*reverify_args, env={"ROLLMESH_API_KEY": "wrong-key"})
    assert code != 0 and "UNAUTHENTICATED: missing or wrong bearer token" in err


async def test_trainer_sink_server_requires_the_key_and_the_scheduler_sends_it(mesh: dict[str, str]) -> None:
    service = sink_pb2.DESCRIPTOR.services_by_name["RolloutSink"]
    async with SinkServer(window=8, api_key=KEY) as sink:
        for bad in (None, "wrong-key"):
            async with aio_channel(sink.address, api_key=bad) as ch:
                for method in service.methods:  # ListCommitted, Consume (bidi)
                    code = await _call_any(ch, service, method)
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (method.name, bad)
                health = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S
                )
                assert health.status == health_pb2.HealthCheckResponse.SERVING

        async with await Client.connect(**mesh, api_key=KEY) as c:
            spec = scheduler_pb2.JobSpec(benchmark="arithmetic", limit=2, num_repeats=2)
            spec.sink.grpc.address = sink.address
            job = await c.scheduler.submit(spec)
            got = [r async for r in sink.rollouts(until_closed=True)]
            final = await job.result(timeout_s=120)
        assert final.state == scheduler_pb2.JOB_STATE_SUCCEEDED, final.error
        assert sorted(r.key for r in got) == [(t, i) for t in range(2) for i in range(2)]


async def test_the_example_trainer_runs_a_job_against_a_keyed_mesh(mesh: dict[str, str]) -> None:
    """examples/trainer_loop.py with ROLLMESH_API_KEY set: its submit carries the key (it sent none:
    UNAUTHENTICATED), and its SinkServer takes the scheduler's keyed stream."""
    args = ["--scheduler", mesh["scheduler"], "--limit", "3", "--num-repeats", "2", "--batch-size", "2"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE_TRAINER),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "ROLLMESH_API_KEY": KEY},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert json.loads(out)["rollouts"] == 6, out
