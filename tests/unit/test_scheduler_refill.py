"""Keeping batches full (refill.py, the engine's side): a group with a failed rollout is replaced by a
fresh one ("same_task": the task's next keys, new seeds; "next_task": the next task the job does not
select), up to the bound; past it the shortfall is counted and named. Replacement keys are new keys,
derived from the task and its generation, so a resumed job reproduces them and writes none twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh.errors import InvalidArgument
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler import store
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.errors import InvalidJobSpec
from rollmesh.scheduler.plan import Plan
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.refill import Group
from rollmesh.scheduler.refill import Refill
from rollmesh.scheduler.refill import group_keys
from rollmesh.scheduler.refill import replacement_bound
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.scheduler.spec import validate
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])
N = 2  # rollouts per group


def _plan(mode: str, *, rows: int = 10, limit: int = 4, **kw: Any) -> Plan:
    spec = JobSpec(dataset="d", replace_groups=mode, num_repeats=N, limit=limit, **kw)
    return Plan(spec, Path("d.jsonl"), [{}] * rows, list(range(limit)), N, 1)


def _keys(*pairs: tuple[int, int]) -> set[RolloutKey]:
    return {RolloutKey(t, r) for t, r in pairs}


def test_the_bound_is_the_larger_of_count_and_fraction_and_defaults_to_the_job_s_groups() -> None:
    assert replacement_bound(10, 0, 0.0) == 10
    assert replacement_bound(10, 3, 0.0) == 3
    assert replacement_bound(10, 3, 0.5) == 5
    assert replacement_bound(10, 0, 0.25) == 2


def test_same_task_replaces_with_the_task_s_next_keys_until_the_bound() -> None:
    refill = Refill(_plan("same_task", max_replacements=2), set())
    assert [g.task_index for g in refill.initial] == [0, 1, 2, 3]
    assert refill.initial[1].keys == (RolloutKey(1, 0), RolloutKey(1, 1))
    first = refill.replace(refill.initial[1])
    assert first == Group(1, 1, (RolloutKey(1, 2), RolloutKey(1, 3)))  # seeds starting_seed + 2, + 3
    assert refill.replace(first) == Group(1, 2, group_keys(1, 2, N))
    assert refill.replace(refill.initial[0]) is None  # the bound (2) is used up
    assert (refill.replaced, refill.short) == (2, 1)
    assert "bound of 2 replacements was used up" in refill.why_short()


def test_next_task_takes_unused_tasks_lowest_first_and_says_when_none_is_left() -> None:
    refill = Refill(_plan("next_task", rows=6), set())
    assert [refill.replace(refill.initial[i]) for i in (2, 0)] == [
        Group(4, 0, group_keys(4, 0, N)),
        Group(5, 0, group_keys(5, 0, N)),
    ]
    assert refill.replace(refill.initial[1]) is None
    assert refill.short == 1 and "no unused task left" in refill.why_short()


def test_next_task_keeps_to_the_job_s_shard() -> None:
    spec = JobSpec(dataset="d", replace_groups="next_task", num_repeats=N, shard_index=1, shard_count=2)
    refill = Refill(Plan(spec, Path("d"), [{}] * 9, [1, 3], N, 1), set())
    assert refill.replace(refill.initial[0]) == Group(5, 0, group_keys(5, 0, N))
    assert refill.replace(refill.initial[0]) == Group(7, 0, group_keys(7, 0, N))
    assert refill.replace(refill.initial[0]) is None


def test_same_task_resume_skips_tasks_with_a_whole_generation_and_runs_past_any_stored_key() -> None:
    # Task 0: generation 1 whole (generation 0 failed before). Task 1: generation 0 torn (one key).
    # Task 2: nothing. Task 3: generation 0 whole.
    existing = _keys((0, 2), (0, 3), (1, 0), (3, 0), (3, 1))
    refill = Refill(_plan("same_task", max_replacements=5), existing)
    assert refill.initial == [Group(1, 1, group_keys(1, 1, N)), Group(2, 0, group_keys(2, 0, N))]
    assert refill.skipped_rollouts == 2 * N
    assert refill.bound_left == 4  # task 0's replacement counts toward the bound
    assert not {k for g in refill.initial for k in g.keys} & existing


def test_next_task_resume_counts_stored_replacements_toward_the_groups_owed() -> None:
    # Tasks 0 and 2 done; task 4 (a replacement) done; task 1 torn. Owed: 4 - 3 = 1 group, taken
    # from the job's untouched tasks (3) first.
    existing = _keys((0, 0), (0, 1), (2, 0), (2, 1), (4, 0), (4, 1), (1, 0))
    refill = Refill(_plan("next_task"), existing)
    assert refill.initial == [Group(3, 0, group_keys(3, 0, N))]
    assert refill.skipped_rollouts == 3 * N
    assert refill.replace(refill.initial[0]) == Group(5, 0, group_keys(5, 0, N))  # 4 is used


def test_a_job_resumes_only_with_the_same_replacement_mode() -> None:
    """Which keys stand for a task depends on the mode: resume_latest must not pick a job of another."""
    assert store.identity(JobSpec(replace_groups="same_task")) != store.identity(JobSpec())
    assert store.identity(JobSpec(max_replacements=3)) == store.identity(JobSpec())  # a budget


def test_a_spec_names_a_known_mode() -> None:
    with pytest.raises(InvalidJobSpec, match="replace_groups 'later'"):
        validate(JobSpec(dataset="d", replace_groups="later"))
    with pytest.raises(InvalidJobSpec, match="max_replacements"):
        validate(JobSpec(dataset="d", replace_groups="same_task", max_replacements=-1))


# ---- the engine ------------------------------------------------------------------------------


async def _no_sleep(_: float) -> None:
    return None


class FlakyModel(LocalModel):
    """Fails (INVALID_ARGUMENT, not retried) the rollouts whose keys are in `failing`."""

    def __init__(self, failing: set[RolloutKey]) -> None:
        super().__init__()
        self.failing = failing

    async def generate(self, call: Any) -> Any:
        _, t, r = call.request_id.split("/")[:3]
        if RolloutKey(int(t), int(r)) in self.failing:
            raise InvalidArgument("injected failure", reason="INJECTED")
        return await super().generate(call)


def _run(tmp_path: Path, sink: MemorySink, failing: set[RolloutKey], **kw: Any) -> JobRun:
    path = Rows.arithmetic(8).write(tmp_path / "d.jsonl")
    spec = JobSpec(
        dataset=str(path),
        environment="arithmetic",
        num_repeats=N,
        limit=4,
        retry=RetryPolicy(max_attempts=1, fail_fast_after=0),
        **kw,
    )
    return JobRun(
        "job-r",
        build_plan(CATALOG, spec),
        sink,
        model=FlakyModel(failing),
        env=LocalEnv(),
        hooks=Hooks(sleep=_no_sleep),
    )


def _groups(sink: MemorySink) -> dict[tuple[int, int], list[int]]:
    """The rows written, by (task, generation)."""
    out: dict[tuple[int, int], list[int]] = {}
    for r in sink.rollouts:
        out.setdefault((r.key.task_index, r.key.rollout_index // N), []).append(r.key.rollout_index)
    return out


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_same_task_every_group_ends_whole_and_each_replacement_is_counted(
    tmp_path: Path, concurrency: int
) -> None:
    # Task 1 fails twice (generations 0 and 1), task 3 once.
    failing = _keys((1, 0), (1, 3), (3, 1))
    sink = MemorySink()
    run = _run(tmp_path, sink, failing, replace_groups="same_task", concurrency=concurrency)
    result = await run.run(await run.open())
    assert result.state == "SUCCEEDED", result
    assert _groups(sink) == {(0, 0): [0, 1], (1, 2): [4, 5], (2, 0): [0, 1], (3, 1): [2, 3]}
    assert sorted(r.seed for r in sink.rollouts if r.key.task_index == 1) == [4, 5]  # new seeds
    p = run.progress
    assert (p.groups_replaced, p.groups_short, p.succeeded, p.failed, p.done) == (3, 0, 8, 0, 8)
    # The replaced groups' rollouts are kept as evidence: their own class, or GROUP_REPLACED.
    classes = {(f.key.task_index, f.key.rollout_index): f.error_class for f in sink.failures}
    assert classes == {
        (1, 0): "INJECTED",
        (1, 1): "GROUP_REPLACED",
        (1, 2): "GROUP_REPLACED",
        (1, 3): "INJECTED",
        (3, 0): "GROUP_REPLACED",
        (3, 1): "INJECTED",
    }
    assert run.refill_figures()["groups_replaced"] == 3


async def test_next_task_replaces_with_unused_tasks(tmp_path: Path) -> None:
    failing = _keys((0, 1), (4, 0))  # task 0 fails, its replacement (task 4) fails too
    sink = MemorySink()
    run = _run(tmp_path, sink, failing, replace_groups="next_task", concurrency=1)
    result = await run.run(await run.open())
    assert result.state == "SUCCEEDED", result
    assert sorted(_groups(sink)) == [(1, 0), (2, 0), (3, 0), (5, 0)]
    assert run.progress.groups_replaced == 2 and run.progress.succeeded == 8


async def test_past_the_bound_the_shortfall_is_named_and_no_partial_group_is_written(tmp_path: Path) -> None:
    failing = _keys((0, 0), (2, 1))  # task 0 is replaced (the bound: 1), task 2 is not
    sink = MemorySink()
    run = _run(tmp_path, sink, failing, replace_groups="same_task", max_replacements=1, concurrency=1)
    result = await run.run(await run.open())
    assert result.state == "COMPLETED_WITH_FAILURES"
    assert result.error.startswith("REPLACEMENTS_EXHAUSTED: 1 failed group(s) of 4 could not be replaced")
    assert all(len(keys) == N for keys in _groups(sink).values())  # whole groups only
    p = run.progress
    assert (p.groups_replaced, p.groups_short, p.succeeded, p.failed) == (1, 1, 3 * N, N)
    assert sorted(_groups(sink)) == [(0, 1), (1, 0), (3, 0)]


async def test_a_resumed_job_writes_no_key_twice(tmp_path: Path) -> None:
    failing = _keys((1, 0), (3, 1))
    first = MemorySink()
    run = _run(tmp_path, first, failing, replace_groups="same_task", concurrency=1)
    await run.run(await run.open())
    # Resume from half of what was stored (a crash lost the rest): the stored keys are skipped and
    # the missing groups run with the keys the first run would have given them.
    kept = {r.key for r in first.rollouts if r.key.task_index in (1, 2)}
    again = MemorySink(existing=kept)
    run2 = _run(tmp_path, again, failing, replace_groups="same_task", concurrency=1)
    result = await run2.run(await run2.open())
    assert result.state == "SUCCEEDED", result
    assert not {r.key for r in again.rollouts} & kept
    assert {r.key for r in again.rollouts} | kept == {r.key for r in first.rollouts}
    assert run2.progress.skipped_existing == 2 * N and run2.progress.groups_replaced == 1
