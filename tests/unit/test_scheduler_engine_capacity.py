"""Automatic concurrency and the engines' batch capacity: a gateway that reports what its engines run
at once (vLLM's max_num_seqs) starts the job's limit above it and keeps it from cutting below; one that
cannot say leaves the small start; a fixed concurrency is taken as given, however large."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.concurrency import Limiter
from rollmesh.scheduler.engine import AUTO_MAX
from rollmesh.scheduler.engine import AUTO_START
from rollmesh.scheduler.engine import CAPACITY_HEADROOM
from rollmesh.scheduler.engine import PROGRAM_START_PER_CORE
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.spec import JobSpec
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


def test_a_floor_is_the_start_and_no_cut_goes_below_it() -> None:
    lim = Limiter(16, adaptive=True, max_limit=1024, floor=200, clock=lambda: 0.0)
    assert lim.limit == 200
    for _ in range(200):
        lim.observe(0.01)  # a flat first window: the best baseline, and slow start doubles
    assert lim.limit == 400
    seen = []
    for _ in range(6):
        for _ in range(256):
            lim.observe(5.0)  # 500x the best latency: queueing, cut after cut
        seen.append(lim.limit)
    assert seen == [280, 200, 200, 200, 200, 200]


def test_a_floor_above_the_maximum_is_the_maximum() -> None:
    assert Limiter(16, adaptive=True, max_limit=300, floor=5000).limit == 300


class _NoCapacity(LocalModel):
    async def engine_capacity(self, model: str) -> int:
        raise RuntimeError("the gateway does not answer ListModels")


async def _limit_of(tmp_path: Path, model: LocalModel, *, succeeds: bool = True, **spec: Any) -> int:
    path = Rows.arithmetic(4).write(tmp_path / "d.jsonl")
    mgr = JobManager(
        CATALOG,
        model=model,
        env=LocalEnv(),
        output_dir=str(tmp_path),
        sink_factory=lambda job_id, plan, directory: MemorySink(),
    )
    try:
        rec = await mgr.submit(
            JobSpec(dataset=str(path), environment="arithmetic", output_dir=str(tmp_path), **spec)
        )
        assert rec.run is not None
        limit = rec.run.limiter.limit
        assert (rec.run.limiter.cpu is not None) == bool(spec.get("agent_program"))
        done = await mgr.wait(rec.job_id)
        assert done.state == "SUCCEEDED" or not succeeds, done.message
        return limit
    finally:
        await mgr.aclose()


async def test_automatic_concurrency_starts_above_the_engines_capacity(tmp_path: Path) -> None:
    # rollouts outside the engine (linger, gateway, verifier, sink) leave slots empty at 1x
    assert await _limit_of(tmp_path, LocalModel(capacity=300)) == CAPACITY_HEADROOM * 300
    assert await _limit_of(tmp_path, LocalModel(capacity=4000)) == AUTO_MAX


async def test_unknown_capacity_starts_small(tmp_path: Path) -> None:
    assert await _limit_of(tmp_path, LocalModel(capacity=0)) == AUTO_START
    assert await _limit_of(tmp_path, _NoCapacity()) == AUTO_START


async def test_a_fixed_concurrency_is_not_capped(tmp_path: Path) -> None:
    assert await _limit_of(tmp_path, LocalModel(capacity=512), concurrency=5000) == 5000


async def test_a_job_of_agent_programs_starts_at_the_hosts_cores_not_the_engines(tmp_path: Path) -> None:
    # The programs run on this host: 80 at once on 2 cores (2 x an engine capacity of 40) was a
    # load average of 98. (The program here makes no model call: the job fails, its limit stands.)
    limit = await _limit_of(tmp_path, LocalModel(capacity=40), succeeds=False, agent_program=("true",))
    assert limit == PROGRAM_START_PER_CORE * (os.cpu_count() or 1)
