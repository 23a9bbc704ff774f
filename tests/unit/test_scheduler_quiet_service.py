"""A verifier that hangs while keeping its connection (a wedged process) makes calls wait for
their deadline without failing: the job's progress must say what it waits on, not look stuck."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh import errors as mesh_errors
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.retry import Outages
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.scheduler.watchdog import GATEWAY
from rollmesh.scheduler.watchdog import VERIFIER
from rollmesh.scheduler.watchdog import Watchdog
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

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


class _Probed(_HangingVerifier):
    """A hung verifier that answers health checks (`alive`) or not: slow, or stopped."""

    def __init__(self, alive: bool) -> None:
        super().__init__()
        self.alive = alive
        self.probes = 0

    async def responsive(self, timeout_s: float) -> bool:
        self.probes += 1
        return self.alive


def _hung_job(tmp_path: Path, env: LocalEnv, budget_s: float) -> tuple[JobRun, MemorySink]:
    path = Rows.arithmetic(6).write(tmp_path / "d.jsonl")
    retry = RetryPolicy(unavailable_budget_s=budget_s)
    spec = JobSpec(dataset=str(path), environment="arithmetic", concurrency=3, retry=retry)
    sink = MemorySink()
    return JobRun("job-v", build_plan(CATALOG, spec), sink, model=LocalModel(), env=env), sink


@pytest.mark.parametrize("probed", [False, True])
async def test_a_hung_verifier_fails_the_job_within_the_budget_naming_it(
    tmp_path: Path, probed: bool
) -> None:
    """Not after keepalive (80 s) plus the budget, nor the rollout timeout (300 s): the budget."""
    env = _Probed(alive=False) if probed else _HangingVerifier()
    run, sink = _hung_job(tmp_path, env, budget_s=2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    result = await asyncio.wait_for(run.run(await run.open()), timeout=60)
    took = loop.time() - t0
    env.go.set()
    assert result.state == "FAILED", result
    assert "the verifier has been unreachable" in result.error and "answered none of 3 calls" in result.error
    assert ("nor a health check" in result.error) == probed, result.error
    assert "resume the job" in result.error
    assert 2 <= took < 2 + 5, took  # the budget, a tick, and slack for a loaded machine
    assert not sink.rollouts
    assert [f.error_class for f in sink.failures] == ["VERIFIER_UNRESPONSIVE"] * 3, sink.failures


async def test_a_slow_verifier_that_answers_its_health_check_is_not_cut(tmp_path: Path) -> None:
    env = _Probed(alive=True)
    run, sink = _hung_job(tmp_path, env, budget_s=1)
    asyncio.get_running_loop().call_later(4.0, env.go.set)  # 4 x the budget, alive all along
    result = await asyncio.wait_for(run.run(await run.open()), timeout=60)
    assert result.state == "SUCCEEDED", result.error
    assert env.probes >= 2 and len(sink.rollouts) == 6 and not sink.failures


async def test_a_verifier_hang_shorter_than_the_budget_costs_nothing(tmp_path: Path) -> None:
    env = _HangingVerifier()
    run, sink = _hung_job(tmp_path, env, budget_s=5)
    asyncio.get_running_loop().call_later(2.0, env.go.set)
    result = await asyncio.wait_for(run.run(await run.open()), timeout=60)
    assert result.state == "SUCCEEDED", result.error
    assert sorted(r.key.as_str() for r in sink.rollouts) == sorted({r.key.as_str() for r in sink.rollouts})
    assert len(sink.rollouts) == 6 and not sink.failures and run.progress.retries == 0


class _StoppedThenKeepaliveCut(_Probed):
    """A stopped verifier (no health check) whose waiting calls gRPC keepalive cuts with UNAVAILABLE
    `cut_after_s` into the hang; later calls hang again."""

    def __init__(self, cut_after_s: float) -> None:
        super().__init__(alive=False)
        self.cut_after_s = cut_after_s
        self.cut = asyncio.Event()

    async def verify(self, *args: Any) -> Any:
        if not self.cut.is_set():
            loop = asyncio.get_running_loop()
            if not self.waiting:
                loop.call_later(self.cut_after_s, self.cut.set)
            self.waiting += 1
            await self.cut.wait()
            raise mesh_errors.Unavailable("Stream removed (ping timeout)")
        return await super().verify(*args)

    async def seed_session(self, *args: Any) -> Any:
        if self.cut.is_set():  # still stopped: a retry's first call hangs too
            await self.go.wait()
        return await super().seed_session(*args)


async def test_a_hung_verifier_counts_from_its_last_answer_even_when_keepalive_cuts_its_calls(
    tmp_path: Path,
) -> None:
    """The failed health check (at quiet_shown_s) dates the outage from the last answer: keepalive's
    UNAVAILABLE later must not restart the budget (it did: the job failed budget after the cut)."""
    env = _StoppedThenKeepaliveCut(cut_after_s=3.0)
    run, _ = _hung_job(tmp_path, env, budget_s=6)
    run.outages.quiet_shown_s = 0.5
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    result = await asyncio.wait_for(run.run(await run.open()), timeout=60)
    took = loop.time() - t0
    env.go.set()
    assert result.state == "FAILED" and "the verifier has been unreachable" in result.error, result
    assert 6 <= took < 6 + 2.5, took  # not 3 + 6


async def test_the_watchdog_survives_a_first_call_to_another_service_during_its_health_check() -> None:
    """The check awaits a probe while iterating the services: a first verifier call meanwhile added
    one, and the watchdog task died ("dictionary changed size during iteration"), hangs unwatched."""
    now = [0.0]
    outages = Outages(1.0, clock=lambda: now[0], quiet_shown_s=0.5)
    calls: list[asyncio.Task[Any]] = []

    async def alive(timeout_s: float) -> bool:
        calls.append(asyncio.create_task(watchdog.watch(VERIFIER, asyncio.Event().wait())))
        await asyncio.sleep(0)
        return True

    watchdog = Watchdog(outages, {GATEWAY: alive})
    calls.append(asyncio.create_task(watchdog.watch(GATEWAY, asyncio.Event().wait())))
    await asyncio.sleep(0)
    now[0] = 2.0
    try:
        await watchdog.check()
        assert outages.down == [] and len(calls) == 2  # slow, not hung: nothing cut
    finally:
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
