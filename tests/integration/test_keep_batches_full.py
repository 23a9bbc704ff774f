"""Keeping batches full end to end: the real gateway (fake backend answering by task and seed) and the
real verifier over gRPC, the scheduler serving gRPC (a job submitted through the SDK), and a trainer
embedding the SDK's SinkServer with group-complete delivery. About 20% of rollouts fail: the
environment refuses (BAD_TASK, never retried) the answers whose (task, seed) hash to 0 mod 5, the same
ones on every run. The trainer asks for batches of B groups of G and gets every batch full; each
failed group was replaced, and the job counts exactly the groups that failed (progress, metrics,
Prometheus). With a bound too small, the shortfall is the job's named outcome and still no partial
group reaches the trainer. A job cancelled midway and resumed writes no key twice and ends with one
whole group per task."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import pytest_asyncio
from prometheus_client import REGISTRY

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler import store
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.servicer import SchedulerServicer
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.errors import BadTask
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh.verifier.workers import WorkerPool
from rollmesh_client import Client
from rollmesh_client.trainer import SinkServer
from rollmesh_client.trainer import TrainerRollout
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.conftest import StartServer

ROWS, TASKS, G, B = 48, 8, 4, 2  # dataset rows, tasks the job selects, group size, groups per batch


def fails(task: int, seed: int) -> bool:
    """The rollouts that fail: about one in five, fixed by (task, seed)."""
    return hashlib.sha256(f"{task}:{seed}".encode()).digest()[0] % 5 == 0


def failed_groups_same_task(tasks: range) -> int:
    """What failed with "same_task": per task, the generations before its first with no failure."""
    count = 0
    for t in tasks:
        g = 0
        while any(fails(t, g * G + r) for r in range(G)):
            count, g = count + 1, g + 1
    return count


@dataclass
class Flaky(Environment):
    """Reward 1 for every answer it accepts; BAD_TASK for the failing (task, seed). A gate, once
    `hold_after` verifications passed, holds the rest (to cancel a job midway)."""

    context: EnvContext
    hold_after: int = -1
    verified: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    holding: asyncio.Event = field(default_factory=asyncio.Event)

    async def verify(  # type: ignore[override]
        self, task: Task, response: Response, session: Session | None = None
    ) -> VerifyResult:
        m = re.fullmatch(r"task (\d+) seed (\d+)", response.final_text.strip())
        assert m, response.final_text
        self.verified += 1
        if 0 <= self.hold_after < self.verified and not self.gate.is_set():
            self.holding.set()
            await self.gate.wait()
        if fails(int(m.group(1)), int(m.group(2))):
            raise BadTask(f"injected failure for {m.group(0)}")
        return VerifyResult(reward=1.0)


@dataclass
class Mesh:
    env: Flaky
    manager: JobManager
    scheduler: str
    data: Path
    results: Path


@pytest_asyncio.fixture
async def mesh(start_server: StartServer, tmp_path: Path) -> AsyncIterator[Mesh]:
    def plays(prompt_text: str, request: EngineRequest) -> str:
        task = int(m.group(1)) if (m := re.search(r"Task (\d+)", prompt_text)) else -1
        return f"task {task} seed {int(request.sampling.seed or 0)}"

    gateway = Gateway([FakeBackend("tiny", script=plays, max_model_len=4096)])
    await gateway.start()
    cfg = VerifierConfig()
    env = Flaky(EnvContext("flaky", None, cfg, WorkerPool(1)))
    service = VerifierService(cfg, Discovery({"flaky": Loaded("flaky", env, "tests")}, {}))
    await service.start()
    ver = await start_server([ServiceBinding.of(VerifierServicer(service))])
    gw = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    model, port = GatewayModel.connect(gw.address), VerifierEnv.connect(ver.address)
    manager = JobManager(Catalog([Root(BUILTIN_ROOT, 0, "root")]), model=model, env=port)
    sched = await start_server([ServiceBinding.of(SchedulerServicer(manager))])
    data = tmp_path / "tasks.jsonl"
    data.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": f"Task {i}: answer."}}) + "\n"
            for i in range(ROWS)
        )
    )
    try:
        yield Mesh(env, manager, sched.address, data, tmp_path / "runs")
    finally:
        await manager.aclose()
        await model.close()
        await port.close()
        await service.aclose()
        await gateway.shutdown()


def _spec(mesh: Mesh, mode: str, **kw: object) -> pb.JobSpec:
    return pb.JobSpec(
        dataset=str(mesh.data),
        environment="flaky",
        num_repeats=G,
        limit=TASKS,
        concurrency=6,
        output_dir=str(mesh.results),
        replace_groups=mode,
        retry=pb.RetryPolicy(fail_fast_after=1000),
        **kw,  # type: ignore[arg-type]
    )


async def _train(mesh: Mesh, spec: pb.JobSpec) -> tuple[pb.Job, list[list[TrainerRollout]]]:
    """Submit `spec` to a trainer's sink; the trainer takes batches of B*G until the job closes."""
    batches: list[list[TrainerRollout]] = []
    async with SinkServer(window=4 * G, group_complete=True) as sink:
        spec.sink.grpc.address = sink.address
        async with await Client.connect(scheduler=mesh.scheduler) as client:
            handle = await client.scheduler.submit(spec)
            async for batch in sink.batches(B * G, until_closed=True):
                batches.append(batch)
            job = await handle.result(poll_s=0.05, timeout_s=120)
    return job, batches


def _groups_of(batch: list[TrainerRollout]) -> dict[tuple[int, int], list[int]]:
    out: dict[tuple[int, int], list[int]] = {}
    for r in batch:
        out.setdefault((r.task_index, r.rollout_index // G), []).append(r.rollout_index)
    return out


def _refilled(result: str) -> float:
    return REGISTRY.get_sample_value("rollmesh_scheduler_groups_refilled_total", {"result": result}) or 0.0


async def test_a_trainer_asking_for_full_batches_gets_every_batch_full(mesh: Mesh) -> None:
    expected = failed_groups_same_task(range(TASKS))
    assert 2 <= expected < 50  # the data does fail: about 20% of rollouts, 59% of groups of 4
    before = _refilled("replaced")
    job, batches = await _train(mesh, _spec(mesh, "same_task", max_replacements=50))
    assert pb.JobState.Name(job.state) == "JOB_STATE_SUCCEEDED", job.error
    assert len(batches) == TASKS // B
    for batch in batches:
        groups = _groups_of(batch)
        assert len(batch) == B * G and len(groups) == B, groups  # full: B whole groups
        for (task, gen), indices in groups.items():
            assert sorted(indices) == list(range(gen * G, gen * G + G))
            assert not any(fails(task, i) for i in indices)
    assert sorted(t for b in batches for t, _ in _groups_of(b)) == list(range(TASKS))  # each task once
    assert job.progress.groups_replaced == expected and job.progress.groups_short == 0
    assert job.progress.succeeded == TASKS * G and job.progress.failed == 0
    assert _refilled("replaced") - before == expected
    metrics = await mesh.manager.metrics(job.job_id)
    assert metrics["groups_replaced"] == expected and metrics["groups_short"] == 0


async def test_next_task_fills_batches_from_tasks_the_job_did_not_select(mesh: Mesh) -> None:
    job, batches = await _train(mesh, _spec(mesh, "next_task", max_replacements=40))
    delivered = [key for b in batches for key in _groups_of(b)]
    failed_own = sum(any(fails(t, r) for r in range(G)) for t in range(TASKS))
    assert pb.JobState.Name(job.state) == "JOB_STATE_SUCCEEDED", job.error
    assert all(len(b) == B * G for b in batches) and len(delivered) == TASKS
    assert sum(t >= TASKS for t, _ in delivered) == TASKS - sum(t < TASKS for t, _ in delivered)
    assert job.progress.groups_replaced >= failed_own  # a replacement that failed was replaced too


async def test_past_the_bound_the_shortfall_is_named_and_no_partial_group_is_delivered(mesh: Mesh) -> None:
    job, batches = await _train(mesh, _spec(mesh, "same_task", max_replacements=1))
    p = job.progress
    assert pb.JobState.Name(job.state) == "JOB_STATE_COMPLETED_WITH_FAILURES"
    assert job.error.startswith("REPLACEMENTS_EXHAUSTED: ") and "--max-replacements" in job.error
    assert p.groups_replaced == 1 and p.groups_short >= 1
    groups = [g for b in batches for g in _groups_of(b).values()]
    assert len(groups) == TASKS - p.groups_short and all(len(g) == G for g in groups)
    assert p.failed == p.groups_short * G and p.succeeded == len(groups) * G


async def test_a_job_cancelled_midway_and_resumed_writes_no_key_twice(mesh: Mesh) -> None:
    mesh.env.hold_after = TASKS * G // 2
    async with await Client.connect(scheduler=mesh.scheduler) as client:
        first = await client.scheduler.submit(_spec(mesh, "same_task", max_replacements=50))
        await asyncio.wait_for(mesh.env.holding.wait(), timeout=60)
        await first.cancel()
        await first.result(poll_s=0.05, timeout_s=60)
        mesh.env.gate.set()
        stored = (mesh.results / first.job_id / store.ROLLOUTS).read_text().splitlines()
        resumed = await client.scheduler.submit(
            _spec(mesh, "same_task", max_replacements=50, resume_job_id=first.job_id)
        )
        job = await resumed.result(poll_s=0.05, timeout_s=120)
    assert pb.JobState.Name(job.state) == "JOB_STATE_SUCCEEDED", job.error
    rows = [
        json.loads(line) for line in (mesh.results / first.job_id / store.ROLLOUTS).read_text().splitlines()
    ]
    keys = [(r["task_index"], r["rollout_index"]) for r in rows]
    assert len(keys) == len(set(keys))  # no key twice
    assert 0 < len(stored) < len(rows) and job.progress.skipped_existing == len(stored)
    by_task: dict[int, list[int]] = {}
    for t, i in keys:
        by_task.setdefault(t, []).append(i)
    assert sorted(by_task) == list(range(TASKS))
    for t, indices in by_task.items():  # one whole generation per task, the first that fails nowhere
        g = min(indices) // G
        assert sorted(indices) == list(range(g * G, g * G + G))
        assert all(any(fails(t, h * G + r) for r in range(G)) for h in range(g))
        assert not any(fails(t, i) for i in indices)


class OneGroupStale(SinkServer):
    """A trainer whose policy is 2 versions ahead when task 1's first group (keys (1, 0..G-1)) is
    delivered, and on version 0 otherwise: with max_staleness=1 that group, and only it, is stale."""

    def _deliverable(self, unit: list[TrainerRollout]) -> list[TrainerRollout]:
        self.policy_version = 2 if any(r.key == (1, 0) for r in unit) else 0
        return super()._deliverable(unit)


async def test_a_group_the_trainer_drops_as_stale_is_replaced_while_the_job_runs(mesh: Mesh) -> None:
    expected = failed_groups_same_task(range(TASKS)) + 1  # the failed groups, and the stale one
    groups: list[list[TrainerRollout]] = []
    spec = _spec(mesh, "same_task", max_replacements=50)
    spec.sink.grpc.window = 2  # the job runs at most 2 groups ahead of the trainer: still running
    async with OneGroupStale(window=4 * G, group_complete=True, max_staleness=1) as sink:
        spec.sink.grpc.address = sink.address
        async with await Client.connect(scheduler=mesh.scheduler) as client:
            handle = await client.scheduler.submit(spec)
            async for group in sink.groups(until_closed=True):
                groups.append(group)
            job = await handle.result(poll_s=0.05, timeout_s=120)
        assert sink.stats.dropped_stale == G  # the whole group, not a part of it
    assert pb.JobState.Name(job.state) == "JOB_STATE_SUCCEEDED", job.error
    got = sorted((g[0].task_index, g[0].rollout_index // G, len(g)) for g in groups)
    assert [t for t, _, _ in got] == list(range(TASKS)) and all(n == G for _, _, n in got)
    assert (1, 1, G) in got  # task 1's stale generation 0 replaced by generation 1
    assert job.progress.groups_replaced == expected and job.progress.stale_dropped == G
    assert job.progress.groups_short == 0
