"""The scheduler's own calls to the gateway and the verifier in its metrics (the p95 verify time it
sees was only in a job's metrics.json): against real servers, each call counted by service, method
and status code and timed as the scheduler sees it, a Generate or Verify over the multiplexed stream
counted as one call, a failed call under its code; and the code of each kind of failure."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.errors import Unavailable
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.telemetry import CallRecorder
from rollmesh.scheduler.telemetry import code_of
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import NotFoundError
from tests.conftest import StartServer


def calls(service: str, method: str, code: str) -> float:
    labels = {"service": service, "method": method, "code": code}
    return REGISTRY.get_sample_value("rollmesh_scheduler_calls_total", labels) or 0.0


def timed(service: str, method: str) -> float:
    labels = {"service": service, "method": method}
    return REGISTRY.get_sample_value("rollmesh_scheduler_call_seconds_count", labels) or 0.0


async def test_each_call_to_the_gateway_and_verifier_is_counted_and_timed(
    start_server: StartServer, tmp_path: Path
) -> None:
    gateway = Gateway([FakeBackend("calls-m")])
    await gateway.start()
    svc = VerifierService.from_catalog(
        replace(VerifierConfig(), max_sessions=4),
        Catalog.from_config(RootsConfig(tmp_path, (), BUILTIN_ROOT, False)),
        entry_points=False,
    )
    await svc.start()
    gw_server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    env_server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
    before = {
        "generate": calls("gateway", "Generate", "OK"),
        "verify": calls("verifier", "Verify", "OK"),
        "verify_s": timed("verifier", "Verify"),
        "describe": calls("verifier", "GetEnvironment", "OK"),
        "missing": calls("verifier", "GetEnvironment", "NOT_FOUND"),
    }
    model, env = GatewayModel.connect(gw_server.address), VerifierEnv.connect(env_server.address)
    try:
        prompt = [{"role": "user", "content": "1+1?"}]
        await asyncio.gather(
            *(model.generate(GenerateCall("", prompt, [], {}, "", f"calls-{i}")) for i in range(3))
        )
        task = {"responses_create_params": {"input": "2 + 2?"}, "expected_answer": "4"}
        answer = [{"role": "assistant", "content": "4"}]
        verdicts = await asyncio.gather(*(env.verify("arithmetic", task, answer, "") for _ in range(5)))
        assert [v.reward for v in verdicts] == [1.0] * 5
        await env.describe_environment("arithmetic")
        with pytest.raises(NotFoundError):
            await env.describe_environment("no-such-environment")
    finally:
        await model.close()
        await env.close()
        await svc.aclose()
        await gateway.shutdown()
    assert calls("gateway", "Generate", "OK") == before["generate"] + 3
    assert calls("verifier", "Verify", "OK") == before["verify"] + 5
    assert timed("verifier", "Verify") == before["verify_s"] + 5
    assert calls("verifier", "GetEnvironment", "OK") == before["describe"] + 1
    assert calls("verifier", "GetEnvironment", "NOT_FOUND") == before["missing"] + 1
    # The failure series of every method exist at 0 before the first failure.
    for method in ("Generate", "Verify", "CallTool", "SeedSession"):
        service = "gateway" if method == "Generate" else "verifier"
        labels = {"service": service, "method": method, "code": "UNAVAILABLE"}
        assert REGISTRY.get_sample_value("rollmesh_scheduler_calls_total", labels) is not None


def test_a_failed_call_is_counted_under_its_status_code() -> None:
    assert code_of(NotFoundError("x", code=grpc.StatusCode.NOT_FOUND)) == "NOT_FOUND"
    assert code_of(Unavailable("down")) == "UNAVAILABLE"  # a domain error (an in-process call)
    assert code_of(asyncio.CancelledError()) == "CANCELLED"
    assert code_of(TimeoutError()) == "DEADLINE_EXCEEDED"
    assert code_of(ValueError("a bug")) == "UNKNOWN"


def test_a_recorder_exports_a_counter_and_a_cumulative_histogram() -> None:
    method = f"Probe{time.monotonic_ns()}"  # a recorder of its own, however often this runs in a process
    recorder = CallRecorder("verifier", method)
    now = time.perf_counter()
    recorder.answered(now - 0.0003)  # in (0.00025, 0.0005]
    recorder.answered(now - 0.0003)
    recorder.failed(Unavailable("down"), now - 2.0)  # in (1, 2.5]
    labels = {"service": "verifier", "method": method}

    def bucket(le: str) -> float | None:
        return REGISTRY.get_sample_value("rollmesh_scheduler_call_seconds_bucket", {**labels, "le": le})

    assert [bucket(le) for le in ("0.00025", "0.0005", "1.0", "2.5", "+Inf")] == [0, 2, 2, 3, 3]
    assert REGISTRY.get_sample_value("rollmesh_scheduler_call_seconds_count", labels) == 3
    total = REGISTRY.get_sample_value("rollmesh_scheduler_call_seconds_sum", labels)
    assert total is not None and 2.0006 <= total < 2.5
    assert calls("verifier", method, "OK") == 2
    assert calls("verifier", method, "UNAVAILABLE") == 1
    assert REGISTRY.get_sample_value("rollmesh_scheduler_calls_total", {**labels, "code": "INTERNAL"}) == 0
