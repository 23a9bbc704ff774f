"""A verifier that hangs while keeping its connection (a wedged process) makes calls wait for
their deadline without failing: the job's progress must say what it waits on, not look stuck."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollmesh.registry import BUILTIN_ROOT, Catalog, Root
from rollmesh.scheduler.engine import Hooks, JobRun
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.spec import JobSpec
from tests.fakes import LocalEnv, LocalModel, MemorySink, Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


class _HangingVerifier(LocalEnv):
    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.waiting = 0

    async def verify(self, *args: Any) -> Any:
        self.waiting += 1
        await self.go.wait()
        return await super().verify(*args)


async def test_a_hung_verifier_shows_in_the_progress_and_clears(tmp_path: Path) -> None:
    path = Rows.arithmetic(3).write(tmp_path / "d.jsonl")
    env = _HangingVerifier()
    plan = build_plan(CATALOG, JobSpec(dataset=str(path), environment="arithmetic", concurrency=3))
    sink = MemorySink()
    run = JobRun("job-q", plan, sink, model=LocalModel(), env=env, hooks=Hooks())
    run.outages.quiet_shown_s = 0.2
    task = asyncio.create_task(run.run(await run.open()))
    deadline = asyncio.get_running_loop().time() + 30
    while "verifier answered none of" not in run.progress_now(finished=False).waiting_on:
        assert asyncio.get_running_loop().time() < deadline, run.progress_now(finished=False)
        await asyncio.sleep(0.05)
    said = run.progress_now(finished=False).waiting_on
    assert said.startswith(f"verifier answered none of {env.waiting} call"), said
    assert "gateway" not in said  # the model answered every call
    env.go.set()
    result = await asyncio.wait_for(task, timeout=30)
    assert result.state == "SUCCEEDED" and len(sink.rollouts) == 3
    assert run.progress_now(finished=False).waiting_on == ""
