"""A gateway that hangs (stopped, wedged: calls neither answer nor fail) versus one call that hangs.

Model calls are cut by the adaptive deadline (deadline.py). When calls are in flight and the gateway
answers none of them, the cut is the gateway's fault (GATEWAY_UNRESPONSIVE, an outage): rollouts wait
within `retry.unavailable_budget_s` without using up their attempts, so a short stall costs no
rollout and a long one fails the job naming the gateway. A call that hangs while the others are
answered stays the rollout's own MODEL_CALL_DEADLINE. Real time, small deadlines (a few seconds)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])
WARM = 30  # calls answered before the hang: the adaptive deadline has its estimate (warmup 20)


class Hanging(LocalModel):
    """Answers the first WARM calls, then hangs every call until `resume` is set (never: stays hung);
    with `only`, only calls asking that question hang, and the others are answered."""

    def __init__(self, only: str | None = None) -> None:
        super().__init__()
        self.resume = asyncio.Event()
        self.only = only
        self.hung = 0

    async def generate(self, call: Any) -> Any:
        asked = str(call.messages[-1].get("content", ""))
        if len(self.calls) >= WARM and (self.only is None or self.only in asked):
            self.hung += 1
            self.calls.append(call)
            await self.resume.wait()
        return await super().generate(call)


def _run(tmp_path: Path, model: Hanging, *, budget_s: float, rows: int = 60) -> tuple[JobRun, MemorySink]:
    path = Rows.arithmetic(rows).write(tmp_path / "d.jsonl")
    retry = RetryPolicy(max_attempts=2, attempt_deadline_floor_s=0.05, unavailable_budget_s=budget_s)
    spec = JobSpec(dataset=str(path), environment="arithmetic", concurrency=4, retry=retry)
    sink = MemorySink()
    return JobRun("job-h", build_plan(CATALOG, spec), sink, model=model, env=LocalEnv()), sink


async def test_a_short_gateway_hang_costs_no_rollout(tmp_path: Path) -> None:
    model = Hanging()
    run, sink = _run(tmp_path, model, budget_s=60)
    asyncio.get_running_loop().call_later(3.0, model.resume.set)  # a 3 s stall: ~60 x the deadline
    result = await asyncio.wait_for(run.run(await run.open()), timeout=120)
    assert result.state == "SUCCEEDED", result.error
    assert len(sink.rollouts) == 60 and not sink.failures
    assert model.hung > 4 and run.progress.retries > 0  # calls were cut and tried again


async def test_a_gateway_hang_past_the_budget_fails_the_job_naming_the_gateway(tmp_path: Path) -> None:
    model = Hanging()
    run, sink = _run(tmp_path, model, budget_s=2)
    result = await asyncio.wait_for(run.run(await run.open()), timeout=120)
    model.resume.set()
    assert result.state == "FAILED"
    assert "the gateway has been unreachable" in result.error and "answered no call" in result.error, (
        result.error
    )
    assert len(sink.failures) <= 4  # only the rollouts in flight, not one per attempt budget
    assert all(f.error_class == "GATEWAY_UNRESPONSIVE" for f in sink.failures), sink.failures


async def test_one_hung_call_among_answered_ones_is_the_rollouts_own_deadline(tmp_path: Path) -> None:
    model = Hanging(only="What is 45 + 46?")  # task 45's calls hang; every other call is answered
    run, sink = _run(tmp_path, model, budget_s=2)
    result = await asyncio.wait_for(run.run(await run.open()), timeout=120)
    model.resume.set()
    assert result.state == "COMPLETED_WITH_FAILURES", result.error
    assert len(sink.rollouts) == 59
    assert [(f.key.task_index, f.error_class, f.attempts) for f in sink.failures] == [
        (45, "MODEL_CALL_DEADLINE", 2)
    ]


class Mute(LocalModel):
    """A gateway that answers its health check but whose model answers no call (`after_s` None), or
    answers each one `after_s` late: a model server hung from its first call, or a slow one."""

    def __init__(self, after_s: float | None) -> None:
        super().__init__()
        self.after_s = after_s

    async def responsive(self, timeout_s: float) -> bool:
        return True

    async def generate(self, call: Any) -> Any:
        await (asyncio.Event().wait() if self.after_s is None else asyncio.sleep(self.after_s))
        return await super().generate(call)


async def test_a_model_that_never_answers_fails_the_job_after_one_rollout_timeout(tmp_path: Path) -> None:
    """No latency observed yet, so the adaptive deadline is rollout_timeout_s, and the gateway is
    alive (slow, not hung): each of 3 attempts waited it out (3 x 300 s by default) before the job
    failed, as DEADLINE_EXCEEDED. Now, no call of the job answered in rollout_timeout_s fails it,
    naming the gateway; a model that answers within it is only slow."""
    path = Rows.arithmetic(4).write(tmp_path / "d.jsonl")
    retry = RetryPolicy(rollout_timeout_s=2.0, unavailable_budget_s=1.0, initial_backoff_s=0.01)
    took = {}
    for after_s, want in ((1.0, "SUCCEEDED"), (None, "FAILED")):
        spec = JobSpec(dataset=str(path), environment="arithmetic", concurrency=2, retry=retry)
        run = JobRun("job-m", build_plan(CATALOG, spec), MemorySink(), model=Mute(after_s), env=LocalEnv())
        t0 = asyncio.get_running_loop().time()
        result = await asyncio.wait_for(run.run(await run.open()), timeout=60)
        took[want] = asyncio.get_running_loop().time() - t0
        assert result.state == want, result.error
    assert "gateway answered none of the job's calls" in result.error, result.error
    # the limit it names is the one that applied: no outage budget would have helped
    assert "unavailable_budget_s" not in result.error and "unreachable" not in result.error, result.error
    assert took["FAILED"] < 2.0 + 2.5, took  # one rollout timeout, a watchdog tick and slack; not 3 x 2 s
