"""The job engine over in-process ports: backpressure, resume, failures, consecutive UNAVAILABLE,
idempotent submit, cancel, AIMD limiter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from rollmesh.mesh.errors import RollmeshError
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.concurrency import Limiter
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh_client import InvalidArgumentError
from rollmesh_client import UnavailableError
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows
from tests.fakes import SlowSink

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


async def _no_sleep(_: float) -> None:
    return None


def _spec(path: Path, **kw: object) -> JobSpec:
    return JobSpec(dataset=str(path), environment="arithmetic", **kw)  # type: ignore[arg-type]


def _run(
    spec: JobSpec, sink: MemorySink, model: LocalModel | None = None, env: LocalEnv | None = None
) -> JobRun:
    plan = build_plan(CATALOG, spec)
    return JobRun(
        "job-t", plan, sink, model=model or LocalModel(), env=env or LocalEnv(), hooks=Hooks(sleep=_no_sleep)
    )


async def test_runs_every_key_once_with_seeds(tmp_path: Path) -> None:
    path = Rows.arithmetic(5).write(tmp_path / "d.jsonl")
    sink = MemorySink()
    run = _run(_spec(path, num_repeats=3, starting_seed=100, concurrency=4), sink)
    result = await run.run(await run.open())
    assert result.state == "SUCCEEDED"
    assert sorted(r.key for r in sink.rollouts) == [RolloutKey(t, i) for t in range(5) for i in range(3)]
    assert {(r.key.rollout_index, r.seed) for r in sink.rollouts} == {(0, 100), (1, 101), (2, 102)}
    assert all(r.reward == 1.0 and r.tokens.token_ids for r in sink.rollouts)
    assert run.progress.done == 15 and run.progress.mean_reward == 1.0 and run.limiter.peak <= 4


async def test_resume_runs_only_missing_keys(tmp_path: Path) -> None:
    path = Rows.arithmetic(4).write(tmp_path / "d.jsonl")
    have = {RolloutKey(0, 0), RolloutKey(0, 1), RolloutKey(2, 1), RolloutKey(99, 0)}
    sink = MemorySink(existing=have)
    run = _run(_spec(path, num_repeats=2), sink)
    await run.run(await run.open())
    written = {r.key for r in sink.rollouts}
    assert written.isdisjoint(have) and written | have >= {
        RolloutKey(t, i) for t in range(4) for i in range(2)
    }
    assert run.progress.skipped_existing == 3 and len(sink.rollouts) == 5


async def test_slow_sink_bounds_in_flight(tmp_path: Path) -> None:
    """A sink acknowledging 20 rollouts/s: in flight never exceeds concurrency, unacked never the window."""
    path = Rows.arithmetic(30).write(tmp_path / "d.jsonl")
    sink = SlowSink(rate=20, window=4)
    model = LocalModel()
    run = _run(_spec(path, concurrency=8), sink, model)
    peak_in_flight = 0

    async def watch() -> None:
        nonlocal peak_in_flight
        while True:
            peak_in_flight = max(peak_in_flight, run.in_flight)
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        result = await run.run(await run.open())
        await sink.close(state=result.state, metrics=None)
    finally:
        watcher.cancel()
    assert len(sink.rollouts) == 30
    assert sink.peak_unacked <= 4 and peak_in_flight <= 8 and run.limiter.peak <= 8
    # the sink set the pace: dispatch could not run ahead of it by more than window + concurrency
    assert model._gw.generated <= 30


async def test_failures_recorded_and_job_completes(tmp_path: Path) -> None:
    path = Rows.arithmetic(6).write(tmp_path / "d.jsonl")
    model, env = LocalModel(), LocalEnv()
    model.errors = [
        UnavailableError("blip", code=grpc.StatusCode.UNAVAILABLE),  # retried ...
        InvalidArgumentError(
            "prompt too long", code=grpc.StatusCode.INVALID_ARGUMENT
        ),  # ... then fails at once
        UnavailableError(
            "blip", code=grpc.StatusCode.UNAVAILABLE
        ),  # next rollout: retried, then verify raises
    ]
    env.verify_errors = [RuntimeError("verifier bug")]
    sink = MemorySink()
    run = _run(_spec(path, concurrency=1, retry=RetryPolicy(max_attempts=3)), sink, model, env)
    result = await run.run(await run.open())
    # Every key ran, but 2 failed permanently and none were allowed: not SUCCEEDED, and the error
    # names the classes with counts and an example message each.
    assert result.state == "COMPLETED_WITH_FAILURES"
    assert "2 of 6 rollouts failed permanently (allowed: 0" in result.error
    assert 'INTERNAL x1 (e.g. "RuntimeError: verifier bug")' in result.error
    assert 'INVALID_ARGUMENT x1 (e.g. "prompt too long")' in result.error
    classes = sorted((f.error_class, f.attempts) for f in sink.failures)
    assert classes == [("INTERNAL", 1), ("INVALID_ARGUMENT", 1)]  # waiting out UNAVAILABLE is no attempt
    assert len(sink.rollouts) == 4 and run.progress.retries == 2
    assert not env.sessions and model.open_sessions == 0  # closed after every attempt


class _Clock:
    """A clock that moves only when the engine sleeps: a 60 s outage budget passes instantly."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


async def test_an_outage_longer_than_the_budget_fails_the_job(tmp_path: Path) -> None:
    path = Rows.arithmetic(50).write(tmp_path / "d.jsonl")
    model = LocalModel()
    model.errors = [UnavailableError("gone", code=grpc.StatusCode.UNAVAILABLE) for _ in range(100_000)]
    sink = MemorySink()
    clock = _Clock()
    plan = build_plan(CATALOG, _spec(path, concurrency=2, retry=RetryPolicy(max_attempts=2)))
    run = JobRun(
        "job-t", plan, sink, model=model, env=LocalEnv(), hooks=Hooks(sleep=clock.sleep, clock=clock)
    )
    result = await run.run(await run.open())
    assert result.state == "FAILED"
    assert "the gateway has been unreachable for 6" in result.error and "unavailable_budget_s" in result.error
    assert clock.now - 1000.0 < 75  # it gave up at the budget, not later
    assert 1 <= len(sink.failures) <= 2 and not sink.rollouts  # only the rollouts in flight were failed


async def test_an_outage_within_the_budget_costs_no_rollouts(tmp_path: Path) -> None:
    """50 s of UNAVAILABLE (budget 60 s), then the gateway is back: every rollout succeeds."""
    path = Rows.arithmetic(20).write(tmp_path / "d.jsonl")
    clock = _Clock()

    class Restarting(LocalModel):
        async def generate(self, call: object) -> object:
            if clock.now < 1050.0:
                raise UnavailableError("connection refused", code=grpc.StatusCode.UNAVAILABLE)
            return await super().generate(call)

    sink = MemorySink()
    plan = build_plan(CATALOG, _spec(path, concurrency=4, retry=RetryPolicy(max_attempts=2)))
    run = JobRun(
        "job-t", plan, sink, model=Restarting(), env=LocalEnv(), hooks=Hooks(sleep=clock.sleep, clock=clock)
    )
    result = await run.run(await run.open())
    assert result.state == "SUCCEEDED", result.error
    assert len(sink.rollouts) == 20 and not sink.failures
    assert all(r.attempts == 1 for r in sink.rollouts) and run.progress.retries > 0


async def test_manager_idempotent_submit_cancel_and_errors(tmp_path: Path) -> None:
    path = Rows.arithmetic(20).write(tmp_path / "d.jsonl")
    sinks: list[MemorySink] = []

    def factory(job_id: str, plan: object, directory: Path) -> MemorySink:
        sinks.append(MemorySink())
        return sinks[-1]

    mgr = JobManager(
        CATALOG,
        model=LocalModel(latency_s=0.05),
        env=LocalEnv(),
        output_dir=str(tmp_path),
        sink_factory=factory,
    )
    try:
        spec = _spec(path, num_repeats=4, concurrency=2, output_dir=str(tmp_path))
        a = await mgr.submit(spec, "req-1")
        b = await mgr.submit(spec, "req-1")
        assert a is b and len(sinks) == 1
        with pytest.raises(RollmeshError) as info:
            await mgr.submit(_spec(path, num_repeats=5, output_dir=str(tmp_path)), "req-1")
        assert (info.value.code, info.value.reason) == (grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_REUSED")
        with pytest.raises(RollmeshError) as info:
            await mgr.submit(JobSpec(dataset=str(path), environment="nope"))
        assert (info.value.code, info.value.reason) == (grpc.StatusCode.NOT_FOUND, "ENVIRONMENT_NOT_FOUND")
        cancelled = await mgr.cancel(a.job_id)
        assert cancelled.state == "CANCELLED" and sinks[0].closed_state == "CANCELLED"
        assert cancelled.progress.done < 80
        with pytest.raises(RollmeshError) as info:
            await mgr.cancel(a.job_id)
        assert (info.value.code, info.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "JOB_FINISHED")
        # job.json lets another manager (a restarted scheduler) report it
        other = JobManager(CATALOG, model=LocalModel(), env=LocalEnv(), output_dir=str(tmp_path))
        again = await other.get(a.job_id)
        assert again.state == "CANCELLED" and again.spec == spec
    finally:
        await mgr.aclose()


async def test_aimd_limiter_grows_when_flat_and_backs_off_when_queueing() -> None:
    lim = Limiter(8, adaptive=True, max_limit=64, clock=lambda: 0.0)  # no throughput signal
    for _ in range(8 * 6):
        lim.observe(0.1)
    grown = lim.limit
    assert grown > 8
    for _ in range(grown):
        lim.observe(1.0)  # latency x10: queueing
    assert lim.limit < grown and lim.limit >= 1
    for _ in range(10_000):
        lim.observe(0.1)
    assert lim.limit <= 64


async def test_aimd_limiter_doubles_until_the_first_cut_then_adds() -> None:
    lim = Limiter(16, adaptive=True, max_limit=1024, clock=lambda: 0.0)
    seen = [lim.limit]
    for _ in range(4):
        for _ in range(lim.limit):  # one window: min(limit, 256) turns
            lim.observe(0.1)
        seen.append(lim.limit)
    assert seen == [16, 32, 64, 128, 256]  # 496 flat turns reach 256 in flight
    for _ in range(256):
        lim.observe(1.0)  # queueing: cut, and slow start is over
    cut = lim.limit
    assert cut == int(256 * 0.7)
    for _ in range(cut):
        lim.observe(0.1)
    assert lim.limit == cut + int(cut**0.5)  # additive from now on


async def test_token_records_are_validated_and_a_drifted_one_fails_its_rollout(tmp_path: Path) -> None:
    from rollmesh.scheduler.tokens import build_token_record

    def drifted(turns: list) -> object:  # type: ignore[type-arg]
        record = build_token_record(turns)
        record.loss_mask[0] = 1  # a prompt token marked as trained-on: corruption
        return record

    path = Rows.arithmetic(3).write(tmp_path / "d.jsonl")
    good = MemorySink()
    run = _run(_spec(path, num_repeats=2, validate_all=True), good)
    assert (await run.run(await run.open())).state == "SUCCEEDED"
    assert len(good.rollouts) == 6 and not good.failures

    bad = MemorySink()
    plan = build_plan(CATALOG, _spec(path, num_repeats=2, validate_all=True))
    hooks = Hooks(sleep=_no_sleep, token_builder=drifted)  # type: ignore[arg-type]
    run = JobRun("job-t", plan, bad, model=LocalModel(), env=LocalEnv(), hooks=hooks)
    result = await run.run(await run.open())  # failures never abort the job: every key ran ...
    assert result.state == "FAILED" and "every rollout failed (6 of 6)" in result.error  # ... none succeeded
    assert not bad.rollouts and len(bad.failures) == 6
    assert {f.error_class for f in bad.failures} == {"TOKEN_RECORD_MISMATCH"}
    assert "loss_mask is 1 on 1 ids outside the generated spans" in bad.failures[0].message

    sampled = MemorySink()
    plan = build_plan(CATALOG, _spec(path, num_repeats=16))
    run = JobRun("job-t", plan, sampled, model=LocalModel(), env=LocalEnv(), hooks=hooks)
    assert (await run.run(await run.open())).state == "COMPLETED_WITH_FAILURES"
    # By default one key in 16 is checked: exactly those rollouts fail, the rest are written.
    assert len(sampled.failures) == 3 and len(sampled.rollouts) == 45


async def test_aimd_limiter_keeps_raising_while_rising_latency_buys_throughput() -> None:
    """A batching engine: a bigger batch costs more latency but completes more per second (up to a
    saturation point). Slow start keeps doubling while throughput rises, where latency alone (2x the
    best at 64 in flight) would have cut; past saturation more in flight only queues, and is cut."""

    def run(rate_gain: float) -> list[int]:
        now = 0.0

        def clock() -> float:
            return now

        lim = Limiter(16, adaptive=True, max_limit=1024, rate_gain=rate_gain, clock=clock)
        limits = []
        for _ in range(12):
            in_flight = lim.limit
            rate = min(20 * in_flight**0.5, 300.0)  # turns per second; saturates at 225 in flight
            for _ in range(max(8, min(in_flight, 256))):
                now += 1.0 / rate
                lim.observe(in_flight / rate)  # Little's law
            limits.append(lim.limit)
        return limits

    with_rate = run(1.1)
    latency_only = run(float("inf"))
    assert max(latency_only) == 64 and max(with_rate) == 512
    assert with_rate[-1] < 512  # cut once more in flight stopped paying


def _simulate(
    limiter: Limiter, clock_at: list[float], rate_of: Callable[[int], float], windows: int
) -> list[int]:
    """Drive `limiter` with a backend completing `rate_of(in_flight)` turns per second (latency by
    Little's law); the limit after each window."""
    limits = []
    for _ in range(windows):
        in_flight = limiter.limit
        rate = rate_of(in_flight)
        for _ in range(max(8, min(in_flight, 256))):
            clock_at[0] += 1.0 / rate
            limiter.observe(in_flight / rate)
        limits.append(limiter.limit)
    return limits


async def test_aimd_limiter_settles_at_the_knee_where_throughput_peaked() -> None:
    """Past a batching engine's saturation, cuts stop at the smallest limit that reached the peak
    throughput (latency alone would keep cutting towards the first, tiny windows' latency); a
    server that only queues past its capacity is brought back down to that capacity; a backend
    that got slower (throughput below the hold share) is cut as before."""
    clock_at = [0.0]

    def batching(in_flight: int) -> float:
        return min(20 * in_flight**0.5, 300.0)  # saturates at 225 in flight

    lim = Limiter(16, adaptive=True, max_limit=1024, clock=lambda: clock_at[0])
    limits = _simulate(lim, clock_at, batching, 40)
    assert max(limits) == 512  # over the knee in slow start, then held at it, probing above it
    assert all(256 <= limit <= 2 * 256 for limit in limits[-30:]), limits
    # (latency alone cut it to 46-114 in flight, where the engine completes 135-210 turns/s, not 300)

    def capacity_64(in_flight: int) -> float:
        return 400.0 * min(in_flight, 64) / 64  # a fixed-size server: past 64 in flight it queues

    lim = Limiter(16, adaptive=True, max_limit=1024, clock=lambda: clock_at[0])
    limits = _simulate(lim, clock_at, capacity_64, 40)
    assert all(64 <= limit <= 3 * 64 for limit in limits[-30:]), limits  # never below its capacity

    lim = Limiter(16, adaptive=True, max_limit=1024, clock=lambda: clock_at[0])
    _simulate(lim, clock_at, batching, 12)
    held = lim.limit
    _simulate(lim, clock_at, lambda n: batching(n) / 3, 3)  # the backend got 3x slower
    assert lim.limit < held * 0.7
