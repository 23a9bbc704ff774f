"""The RolloutScheduler over real gRPC: scheduler -> fake gateway + fake verifier servers, the JSONL
sink, the SDK. Faults: verifier raising, timing out, restarting; gateway UNAVAILABLE."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from rollmesh.mesh.server import MeshServer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.servicer import SchedulerServicer
from rollmesh_client import Client
from rollmesh_client import FailedPreconditionError
from rollmesh_client import InvalidArgumentError
from rollmesh_client import NotFoundError
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.conftest import StartServer
from tests.fakes import FakeGateway
from tests.fakes import FakeVerifier
from tests.fakes import Rows


@dataclass
class Mesh:
    gateway: FakeGateway
    verifier: FakeVerifier
    verifier_server: MeshServer
    scheduler_addr: str
    out: Path
    data: Path
    manager: JobManager


@pytest_asyncio.fixture
async def mesh(start_server: StartServer, tmp_path: Path) -> AsyncIterator[Mesh]:
    gw, ver = FakeGateway(), FakeVerifier()
    gw_server = await start_server([gw.binding()])
    ver_server = await start_server([ver.binding()])
    model = GatewayModel.connect(gw_server.address)
    env = VerifierEnv.connect(ver_server.address)
    out = tmp_path / "runs"
    manager = JobManager(Catalog([Root(BUILTIN_ROOT, 0, "root")]), model=model, env=env, output_dir=str(out))
    sched = await start_server([ServiceBinding.of(SchedulerServicer(manager))])
    data = Rows.arithmetic(20).write(tmp_path / "arith.jsonl")
    try:
        yield Mesh(gw, ver, ver_server, sched.address, out, data, manager)
    finally:
        await manager.aclose()
        await model.close()
        await env.close()


def _spec(m: Mesh, **kw: object) -> pb.JobSpec:
    spec = pb.JobSpec(
        dataset=str(m.data),
        environment="arithmetic",
        num_repeats=2,
        output_dir=str(m.out),
        retry=pb.RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.1),
    )
    for k, v in kw.items():
        if isinstance(v, pb.RetryPolicy):
            spec.retry.MergeFrom(v)
        elif isinstance(v, pb.Shard):
            spec.shard.CopyFrom(v)
        else:
            setattr(spec, k, v)
    return spec


def _rows(m: Mesh, job_id: str, name: str = "rollouts.jsonl") -> list[dict[str, Any]]:
    path = m.out / job_id / name
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


async def test_job_end_to_end_stream_metrics_and_idempotency(mesh: Mesh) -> None:
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        job = await c.scheduler.submit(_spec(mesh, concurrency=4), request_id="r-1")
        same = await c.scheduler.submit(_spec(mesh, concurrency=4), request_id="r-1")
        assert same.job_id == job.job_id
        final = await job.result(poll_s=0.05, timeout_s=60)
        assert pb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED", final.error
        p = final.progress
        assert (p.total, p.done, p.succeeded, p.failed, p.in_flight) == (40, 40, 40, 0, 0)
        assert p.mean_reward == 1.0 and p.rollouts_per_second > 0 and p.tokens_per_second > 0
        rows = _rows(mesh, job.job_id)
        keys = sorted((r["task_index"], r["rollout_index"]) for r in rows)
        assert keys == [(t, i) for t in range(20) for i in range(2)]
        assert rows[0]["expected_answer"] and rows[0]["tokens"]["token_ids"]  # input echoed, tokens added
        assert (mesh.out / job.job_id / "job.json").exists()
        streamed = [item async for item in job.rollouts(offset=5, follow=True)]
        assert [s.offset for s in streamed] == list(range(5, 40))
        with pytest.raises(InvalidArgumentError, match="offset must be 0 or more"):  # not silently from 0
            [item async for item in job.rollouts(offset=-5)]
        assert streamed[0].rollout.key.task_index == rows[5]["task_index"]
        metrics = await job.metrics()
        assert metrics.num_rollouts == 40 and metrics.pass_at_k[1] == 1.0 and metrics.num_tasks == 20
        stored = mesh.out / job.job_id / "metrics.json"
        stored.write_text(json.dumps({**json.loads(stored.read_text()), "pass_at_k": "x"}))  # edited, corrupt
        assert await job.metrics() == metrics  # counted again from the rows (was INTERNAL)
        listed = [j.job_id async for j in c.scheduler.jobs(page_size=1)]
        assert listed == [job.job_id]
        with pytest.raises(FailedPreconditionError) as info:
            await job.cancel()
        assert info.value.reason == "JOB_FINISHED"
        assert not mesh.verifier.sessions and not mesh.gateway.sessions  # every session closed


async def test_follow_stream_while_running(mesh: Mesh) -> None:
    mesh.gateway.latency_s = 0.01
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        job = await c.scheduler.submit(_spec(mesh, concurrency=2))
        seen = [item.offset async for item in job.rollouts(follow=True)]
        assert seen == list(range(40))


async def test_invalid_specs_rejected_at_submit(mesh: Mesh, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(mesh.data.read_text() + "{oops\n")
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        cases = [
            (_spec(mesh, dataset=str(bad)), InvalidArgumentError, "MALFORMED_DATASET_ROW", "bad.jsonl:21"),
            (_spec(mesh, environment="nope"), NotFoundError, "ENVIRONMENT_NOT_FOUND", "nope"),
            (_spec(mesh, dataset="no-such-dataset"), NotFoundError, "DATASET_NOT_FOUND", "no-such-dataset"),
            (_spec(mesh, num_repeats=-2), InvalidArgumentError, "INVALID_JOB_SPEC", "num_repeats"),
            (_spec(mesh, shard=pb.Shard(index=4, count=4)), InvalidArgumentError, "INVALID_SHARD", "[0, 4)"),
        ]
        for spec, cls, reason, needle in cases:
            with pytest.raises(cls) as info:
                await c.scheduler.submit(spec)
            assert info.value.reason == reason and needle in info.value.message
        with pytest.raises(NotFoundError) as nf:
            await c.scheduler.get("job-missing")
        assert nf.value.reason == "JOB_NOT_FOUND"
    assert mesh.gateway.generated == 0  # nothing ran


async def test_verifier_raising_and_timing_out(mesh: Mesh) -> None:
    mesh.verifier.faults.fail("Verify", grpc.StatusCode.INTERNAL, times=3, message="verify crashed")
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        job = await c.scheduler.submit(_spec(mesh, concurrency=1, num_repeats=1))
        final = await job.result(poll_s=0.05, timeout_s=60)
        assert pb.JobState.Name(final.state) == "JOB_STATE_COMPLETED_WITH_FAILURES"  # 3 > 0 allowed
        fails = _rows(mesh, job.job_id, "failures.jsonl")
        assert [(f["error_class"], f["attempts"]) for f in fails] == [("INTERNAL", 1)] * 3
        assert "verify crashed" in str(fails[0]["message"])
        assert final.progress.failed == 3 and final.progress.succeeded == 17

        # Verify hangs past the job's 0.5 s attempt deadline twice: DEADLINE_EXCEEDED is retried,
        # then succeeds.
        mesh.verifier.faults.delay("Verify", 1.0, times=2)
        short = pb.RetryPolicy(rollout_timeout_s=0.5)
        job2 = await c.scheduler.submit(_spec(mesh, concurrency=1, num_repeats=1, limit=3, retry=short))
        final2 = await job2.result(poll_s=0.05, timeout_s=60)
        assert final2.progress.succeeded == 3 and final2.progress.retries == 2 and final2.progress.failed == 0

        # Always hanging: after max_attempts the failure says DEADLINE_EXCEEDED.
        mesh.verifier.faults.delay("Verify", 1.0, times=-1)
        job3 = await c.scheduler.submit(_spec(mesh, concurrency=2, num_repeats=1, limit=2, retry=short))
        final3 = await job3.result(poll_s=0.05, timeout_s=60)
        assert pb.JobState.Name(final3.state) == "JOB_STATE_FAILED"  # every rollout failed
        fails3 = _rows(mesh, job3.job_id, "failures.jsonl")
        assert {(f["error_class"], f["attempts"]) for f in fails3} == {("DEADLINE_EXCEEDED", 3)} and len(
            fails3
        ) == 2
        mesh.verifier.faults.clear()


async def test_gateway_unavailable_is_retried(mesh: Mesh) -> None:
    mesh.gateway.faults.fail("Generate", grpc.StatusCode.UNAVAILABLE, times=6, message="replica draining")
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        job = await c.scheduler.submit(_spec(mesh, concurrency=2, retry=pb.RetryPolicy(max_attempts=5)))
        final = await job.result(poll_s=0.05, timeout_s=60)
    assert pb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED"
    assert final.progress.succeeded == 40 and final.progress.retries == 6 and final.progress.failed == 0


async def test_gateway_gone_fails_job_keeping_output(mesh: Mesh) -> None:
    mesh.gateway.faults.fail("Generate", grpc.StatusCode.UNAVAILABLE, times=-1, message="no replicas")
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        spec = _spec(mesh, concurrency=2, retry=pb.RetryPolicy(max_attempts=2, unavailable_budget_s=1.0))
        final = await (await c.scheduler.submit(spec)).result(poll_s=0.05, timeout_s=60)
    assert pb.JobState.Name(final.state) == "JOB_STATE_FAILED"
    assert "the gateway has been unreachable for" in final.error and "(no replicas)" in final.error
    assert "unavailable_budget_s (1 s)" in final.error and "resume" in final.error
    fails = _rows(mesh, final.job_id, "failures.jsonl")
    # Only the rollouts waiting on the gateway when the budget ran out were failed; nothing else ran.
    assert 1 <= len(fails) <= 2 and all(f["error_class"] == "UNAVAILABLE" for f in fails)
    assert not _rows(mesh, final.job_id)


async def test_verifier_restart_mid_job(mesh: Mesh) -> None:
    mesh.gateway.latency_s = 0.01
    port = mesh.verifier_server.port
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        spec = _spec(
            mesh, concurrency=4, num_repeats=4, retry=pb.RetryPolicy(max_attempts=20, max_backoff_s=0.3)
        )
        job = await c.scheduler.submit(spec)
        while (await job.get()).progress.done < 10:  # noqa: ASYNC110 (progress lives in another server)
            await asyncio.sleep(0.02)
        await mesh.verifier_server.stop(grace=0)
        await asyncio.sleep(0.3)  # the verifier is down for a while
        new_verifier = FakeVerifier()
        restarted = await build_server([new_verifier.binding()], f"127.0.0.1:{port}")
        await restarted.start()
        try:
            await wait_serving(restarted.address, timeout_s=10)
            final = await job.result(poll_s=0.05, timeout_s=60)
        finally:
            await restarted.stop(grace=0)
    assert pb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED", final.error
    rows = _rows(mesh, final.job_id)
    fails = _rows(mesh, final.job_id, "failures.jsonl")
    keys = [(r["task_index"], r["rollout_index"]) for r in rows] + [
        (f["task_index"], f["rollout_index"]) for f in fails
    ]
    assert sorted(keys) == [(t, i) for t in range(20) for i in range(4)]  # each key once
    assert final.progress.retries > 0 and new_verifier.seeded > 0
