"""Prometheus metrics (mesh/metrics.py): the interceptor counts each RPC by method and status code
(a domain error's code, INTERNAL for a bug, the code a handler aborted with); the embedded mesh's one
endpoint, scraped over HTTP during and after a job, shows what each service did: rollouts done,
generations and tokens, verifies, the job's state; counters only grow by what the job did."""

from __future__ import annotations

import asyncio
import gc
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.launch import embedded_mesh
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.errors import NotFound
from rollmesh.mesh.metrics import start_endpoint
from rollmesh.mesh.server import ServiceBinding
from rollmesh_client import Client
from rollmesh_client import InternalError
from rollmesh_client import NotFoundError
from rollmesh_client.v1 import registry_pb2
from rollmesh_client.v1 import registry_pb2_grpc
from rollmesh_client.v1 import scheduler_pb2
from tests.conftest import StartServer

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=30) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _handled(method: str, code: str, service: str = "rollmesh.v1.ArtifactRegistry") -> float:
    labels = {"grpc_type": "unary", "grpc_service": service, "grpc_method": method, "grpc_code": code}
    return REGISTRY.get_sample_value("grpc_server_handled_total", labels) or 0.0


class _Failing(registry_pb2_grpc.ArtifactRegistryServicer):
    async def ListRoots(self, request: Any, context: Any) -> Any:
        raise RuntimeError("a bug")

    async def ResolveArtifact(self, request: Any, context: Any) -> Any:
        raise NotFound("no such thing", reason="ARTIFACT_NOT_FOUND")

    async def ListArtifacts(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no")


async def test_each_rpc_is_counted_by_method_and_code(start_server: StartServer) -> None:
    server = await start_server([ServiceBinding.of(_Failing())])
    before = {m: _handled(m, c) for m, c in [("ListRoots", "INTERNAL"), ("ResolveArtifact", "NOT_FOUND")]}
    denied = _handled("ListArtifacts", "PERMISSION_DENIED")
    async with await Client.connect(registry=server.address) as c:
        with pytest.raises(InternalError):
            await c.registry.roots()
        with pytest.raises(NotFoundError):
            await c.registry.resolve("dataset", "x")
        with pytest.raises(NotFoundError):
            await c.registry.resolve("dataset", "y")
        with pytest.raises(Exception, match="no"):
            async for _ in c.registry.artifacts("dataset"):
                pass
    assert _handled("ListRoots", "INTERNAL") == before["ListRoots"] + 1
    assert _handled("ResolveArtifact", "NOT_FOUND") == before["ResolveArtifact"] + 2
    assert _handled("ListArtifacts", "PERMISSION_DENIED") == denied + 1
    count = REGISTRY.get_sample_value(
        "grpc_server_handling_seconds_count",
        {
            "grpc_type": "unary",
            "grpc_service": "rollmesh.v1.ArtifactRegistry",
            "grpc_method": "ResolveArtifact",
        },
    )
    assert count is not None and count >= 2


class _OpenStream(registry_pb2_grpc.ArtifactRegistryServicer):
    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def ReadArtifact(
        self, request: Any, context: Any
    ) -> AsyncIterator[registry_pb2.ReadArtifactResponse]:
        yield registry_pb2.ReadArtifactResponse(relative_path="first")
        await self.release.wait()


def _rpc_count(name: str, **extra: str) -> float:
    labels = {
        "grpc_type": "server_stream",
        "grpc_service": "rollmesh.v1.ArtifactRegistry",
        "grpc_method": "ReadArtifact",
        **extra,
    }
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_an_open_stream_is_counted_started_before_it_is_handled(start_server: StartServer) -> None:
    """A long stream (one GenerateMany per job) was invisible until it ended: started minus handled
    is the streams open now."""
    servicer = _OpenStream()
    server = await start_server([ServiceBinding.of(servicer)])
    started, handled = (
        _rpc_count("grpc_server_started_total"),
        _rpc_count("grpc_server_handled_total", grpc_code="OK"),
    )
    async with grpc.aio.insecure_channel(server.address) as channel:
        call = registry_pb2_grpc.ArtifactRegistryStub(channel).ReadArtifact(
            registry_pb2.ReadArtifactRequest()
        )
        first = await call.read()
        assert first.relative_path == "first"
        assert _rpc_count("grpc_server_started_total") == started + 1
        assert _rpc_count("grpc_server_handled_total", grpc_code="OK") == handled
        servicer.release.set()
        assert await call.read() == grpc.aio.EOF
    for _ in range(1000):  # the server records the end after the client saw it
        if _rpc_count("grpc_server_handled_total", grpc_code="OK") == handled + 1:
            break
        await asyncio.sleep(0.01)
    assert _rpc_count("grpc_server_handled_total", grpc_code="OK") == handled + 1
    assert _rpc_count("grpc_server_started_total") == started + 1


def test_a_metrics_port_in_use_is_one_config_error() -> None:
    first = start_endpoint("127.0.0.1", 0)
    try:
        with pytest.raises(ConfigError, match=f"127.0.0.1:{first.port}.*in use"):
            start_endpoint("127.0.0.1", first.port)
    finally:
        first.stop()


async def test_the_embedded_mesh_serves_every_service_metrics(tmp_path: Path) -> None:
    spec = ModelSpec(name="fake", backend="fake", model="fake")
    cfg = GatewayConfig(models=(spec,), default_model="fake", http_port=-1)
    gc.collect()  # earlier tests' dropped gateways: the live gauges read every one still in memory
    async with embedded_mesh(cfg, output_dir=str(tmp_path / "runs"), metrics_port=0) as mesh:
        assert mesh.metrics_url.startswith("http://127.0.0.1:")
        before = await asyncio.to_thread(_scrape, mesh.metrics_url)
        # Before any job: the gauges read 0 and the failure counters exist (they vanished until used).
        for name, labels in [
            ("rollmesh_scheduler_jobs_waiting", {"service": "gateway"}),
            ("rollmesh_scheduler_jobs_waiting", {"service": "sink"}),
            ("rollmesh_scheduler_jobs", {"state": "RUNNING"}),
            ("rollmesh_scheduler_rollouts_in_flight", {}),
            ("rollmesh_scheduler_rollouts_failed_total", {"error_class": "INTERNAL"}),
            ("rollmesh_scheduler_rollouts_done_total", {"outcome": "failed"}),
            ("rollmesh_gateway_weight_updates_total", {"model": "fake", "outcome": "failed"}),
            ("rollmesh_verifier_sandbox_runs_total", {"result": "crashed"}),
        ]:
            assert (name, tuple(sorted(labels.items()))) in before, (name, labels)
        assert _value(before, "rollmesh_scheduler_rollouts_in_flight") == 0
        async with await Client.connect(**mesh.addresses, timeout_s=120) as c:
            job = await c.scheduler.submit(
                scheduler_pb2.JobSpec(benchmark="arithmetic", limit=3, num_repeats=2)
            )
            final = await job.result(timeout_s=120)
        assert final.state == scheduler_pb2.JOB_STATE_SUCCEEDED
        after = await asyncio.to_thread(_scrape, mesh.metrics_url)

    def grew(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("rollmesh_scheduler_rollouts_done_total", outcome="succeeded") == 6
    assert grew("rollmesh_scheduler_sink_writes_total", sink="jsonl", row="rollout") == 6
    assert grew("rollmesh_scheduler_sink_write_seconds_count", sink="jsonl") == 6
    assert grew("rollmesh_gateway_generations_total", model="fake", finish_reason="stop") >= 6
    assert grew("rollmesh_gateway_tokens_total", model="fake", kind="completion") > 0
    assert grew("rollmesh_gateway_time_to_first_token_seconds_count", model="fake") >= 6
    assert grew("rollmesh_verifier_verifies_total", environment="arithmetic", outcome="ok") == 6
    assert grew("rollmesh_stream_items_total", item="verify", code="OK") == 6
    assert grew("rollmesh_scheduler_calls_total", service="verifier", method="Verify", code="OK") == 6
    assert grew("rollmesh_scheduler_call_seconds_count", service="verifier", method="Verify") == 6
    assert grew("rollmesh_scheduler_calls_total", service="gateway", method="Generate", code="OK") >= 6
    assert _value(after, "rollmesh_scheduler_jobs", state="SUCCEEDED") >= 1
    assert _value(after, "rollmesh_gateway_policy_version", model="fake") == 0
    submit = {
        "grpc_type": "unary",
        "grpc_service": "rollmesh.v1.RolloutScheduler",
        "grpc_method": "SubmitJob",
        "grpc_code": "OK",
    }
    assert grew("grpc_server_handled_total", **submit) == 1
    assert not any(final.job_id in value for _, labels in after for _, value in labels)  # no job id label
