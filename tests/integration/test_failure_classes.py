"""Failure classes name the cause (#12.7), end to end: the project's OpenAI test server fails calls
with given HTTP statuses, the real gateway (openai backend) reports them as ErrorInfo reasons with
`http_status`, and the scheduler writes each class to failures.jsonl, the metrics and the job's
failure summary; 5xx and 429 are retried, 4xx is not."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio

from rollmesh.devtools.openai_server import FaultConfig
from rollmesh.devtools.openai_server import Frequency
from rollmesh.devtools.openai_server import OpenAITestServer
from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.openai import OpenAIBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.servicer import SchedulerServicer
from rollmesh_client import Client
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.conftest import StartServer
from tests.fakes import FakeVerifier
from tests.fakes import Rows

TASKS = 50


@dataclass
class Stack:
    upstream: OpenAITestServer
    scheduler: str
    data: Path
    out: Path


@pytest_asyncio.fixture
async def stack(start_server: StartServer, tmp_path: Path) -> AsyncIterator[Stack]:
    async with OpenAITestServer() as upstream:
        gateway = Gateway([OpenAIBackend("tiny", base_url=upstream.base_url)])
        await gateway.start()
        gw_server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
        ver_server = await start_server([FakeVerifier().binding()])
        model, env = GatewayModel.connect(gw_server.address), VerifierEnv.connect(ver_server.address)
        out = tmp_path / "runs"
        manager = JobManager(
            Catalog([Root(BUILTIN_ROOT, 0, "root")]), model=model, env=env, output_dir=str(out)
        )
        sched = await start_server([ServiceBinding.of(SchedulerServicer(manager))])
        try:
            yield Stack(upstream, sched.address, Rows.arithmetic(TASKS).write(tmp_path / "d.jsonl"), out)
        finally:
            await manager.aclose()
            await model.close()
            await env.close()
            await gateway.shutdown()


async def _run(s: Stack, max_attempts: int) -> tuple[pb.Job, pb.JobMetrics, list[dict[str, object]]]:
    spec = pb.JobSpec(
        dataset=str(s.data),
        environment="arithmetic",
        concurrency=1,  # calls in dataset order, so the failing call numbers are known
        output_dir=str(s.out),
        retry=pb.RetryPolicy(max_attempts=max_attempts, initial_backoff_s=0.01, max_backoff_s=0.05),
    )
    async with await Client.connect(scheduler=s.scheduler) as c:
        job = await c.scheduler.submit(spec)
        final = await job.result(poll_s=0.05, timeout_s=120)
        metrics = await job.metrics()
    path = s.out / final.job_id / "failures.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return final, metrics, rows


async def test_each_upstream_status_is_its_own_class(stack: Stack) -> None:
    # Calls 5, 10, ..., 50 fail, with 500, 400, 429, 503, 500, 400, ... in turn.
    stack.upstream.set_faults(
        FaultConfig(fail_statuses=(500, 400, 429, 503), fail=Frequency(every=5), retry_after_s=0)
    )
    final, metrics, rows = await _run(stack, max_attempts=1)  # one attempt: every failure is written
    want = {
        "UPSTREAM_HTTP_ERROR:500": 3,
        "UPSTREAM_REJECTED:400": 3,
        "UPSTREAM_RATE_LIMITED:429": 2,
        "UPSTREAM_HTTP_ERROR:503": 2,
    }
    assert Counter(str(r["error_class"]) for r in rows) == want
    assert dict(metrics.failures_by_class) == want
    assert {(f.error_class, f.count) for f in final.failure_summary} == set(want.items())
    assert all("HTTP" in f.example_message for f in final.failure_summary)
    assert final.state == pb.JOB_STATE_COMPLETED_WITH_FAILURES and "UPSTREAM_HTTP_ERROR:500 x3" in final.error


async def test_5xx_and_429_are_retried_4xx_is_not(stack: Stack) -> None:
    stack.upstream.set_faults(
        FaultConfig(fail_statuses=(500, 400, 429, 503), fail=Frequency(every=5), retry_after_s=0)
    )
    final, metrics, rows = await _run(stack, max_attempts=3)
    classes = Counter(str(r["error_class"]) for r in rows)
    assert set(classes) == {"UPSTREAM_REJECTED:400"} and classes["UPSTREAM_REJECTED:400"] >= 2
    assert all(r["attempts"] == 1 for r in rows)  # a 4xx is not retried
    assert final.progress.retries >= 4  # the 5xx and 429 calls were, and then succeeded
    assert final.progress.succeeded + final.progress.failed == TASKS
    assert dict(metrics.failures_by_class) == dict(classes)
