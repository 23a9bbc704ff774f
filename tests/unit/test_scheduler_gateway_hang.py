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

from rollmesh.registry import BUILTIN_ROOT, Catalog, Root
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.spec import JobSpec, RetryPolicy
from tests.fakes import LocalEnv, LocalModel, MemorySink, Rows

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
