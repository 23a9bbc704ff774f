"""Keep batches full: which groups a job runs when it replaces failed groups (JobSpec.replace_groups).

A group is a task's `num_repeats` rollouts, run and written together (engine.py holds them until the
last is in). A group with a failed rollout is replaced by a fresh group, up to the job's bound, so a
trainer asking for N full groups gets N:

- "same_task": the same task with new seeds. Generation g of task t is the keys
  (t, g*n) .. (t, g*n + n-1), so its seeds are starting_seed + g*n + r: new ones, and the same
  ones on every run of the job.
- "next_task": the next task of the dataset the job does not select (past its `limit`, in its
  shard), keys (u, 0) .. (u, n-1), taken lowest first.

Keys are never reused: a replacement's keys are ones no earlier group had, so nothing is written
twice. Resume exactly once: a group counts as delivered when all its keys are stored. For
"same_task" a task with any whole generation stored is done; else the generation after the highest
one with anything stored runs (a partly stored one never gets its missing keys: they would join a
group that is gone). For "next_task" the groups still owed are the job's tasks minus the whole
groups stored (its own tasks' and replacement tasks'); the job's tasks with nothing stored run
first, in order, then unused tasks (none with anything stored). Replacements made before a resume
count toward the bound.

When the bound is used up (or "next_task" finds no unused task), a failed group stays failed: the
job's shortfall, counted (`short`) and named (ReplacementsExhausted), never a silent short batch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from rollmesh.scheduler.plan import Plan
from rollmesh.scheduler.plan import select_tasks
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.spec import NEXT_TASK
from rollmesh.scheduler.spec import SAME_TASK

# Replacements a job may make when it names no bound: as many as it has groups.
DEFAULT_BOUND_FRACTION = 1.0


@dataclass(frozen=True)
class Group:
    """One group to run: a task's keys, `generation` > 0 for a same-task replacement."""

    task_index: int
    generation: int
    keys: tuple[RolloutKey, ...]


def group_keys(task_index: int, generation: int, n: int) -> tuple[RolloutKey, ...]:
    return tuple(RolloutKey(task_index, generation * n + r) for r in range(n))


def replacement_bound(groups: int, count: int, fraction: float) -> int:
    """The most replacements: max(count, floor(fraction x groups)); both 0: DEFAULT_BOUND_FRACTION."""
    if not count and not fraction:
        fraction = DEFAULT_BOUND_FRACTION
    return max(count, math.floor(fraction * groups + 1e-9))


class Refill:
    """The groups a run starts with (`initial`) and the replacement of each failed one (`replace`)."""

    def __init__(self, plan: Plan, existing: Iterable[RolloutKey]) -> None:
        spec = plan.spec
        if spec.replace_groups not in (NEXT_TASK, SAME_TASK):
            raise ValueError(f"replace_groups {spec.replace_groups!r} replaces nothing")
        self.mode = spec.replace_groups
        self.n = n = plan.num_repeats
        self.groups = len(plan.task_indices)
        self.bound = replacement_bound(self.groups, spec.max_replacements, spec.max_replacement_fraction)
        self.replaced = 0  # replacements made by this run
        self.short = 0  # failed groups this run could not replace
        stored: dict[int, set[int]] = defaultdict(set)
        for k in existing:
            stored[k.task_index].add(k.rollout_index)

        def whole(task: int, generation: int) -> bool:
            return all(r in stored[task] for r in range(generation * n, (generation + 1) * n))

        self.initial: list[Group] = []
        if self.mode == SAME_TASK:
            self.done_before = 0
            self.used_before = 0
            for t in plan.task_indices:
                gens = {r // n for r in stored.get(t, ())}
                self.used_before += max(gens, default=0)
                if any(whole(t, g) for g in gens):
                    self.done_before += 1
                    continue
                g = max(gens) + 1 if gens else 0
                self.initial.append(Group(t, g, group_keys(t, g, n)))
            self._pool: list[int] = []
        else:
            own = set(plan.task_indices)
            pool = [
                i
                for i in select_tasks(
                    len(plan.rows), shard_index=spec.shard_index, shard_count=spec.shard_count
                )
                if i not in own
            ]
            touched = [u for u in pool if stored.get(u)]
            done_own = [t for t in plan.task_indices if whole(t, 0)]
            done_pool = [u for u in touched if whole(u, 0)]
            self.done_before = len(done_own) + len(done_pool)
            self.used_before = len(touched)
            owed = max(self.groups - self.done_before, 0)
            fresh = [t for t in plan.task_indices if not stored.get(t)]
            self._pool = [u for u in pool if not stored.get(u)]
            run = fresh[:owed]
            run += self._pool[: owed - len(run)]
            del self._pool[: max(owed - len(fresh), 0)]
            self.initial = [Group(t, 0, group_keys(t, 0, n)) for t in run]
        self.bound_left = max(self.bound - self.used_before, 0)

    @property
    def skipped_rollouts(self) -> int:
        """Rollouts of the groups stored before this run (resume): the progress's skipped_existing."""
        return self.done_before * self.n

    def replace(self, failed: Group) -> Group | None:
        """The group that takes `failed`'s place, or None (counted in `short`) when there is none."""
        if self.replaced >= self.bound_left:
            self.short += 1
            return None
        if self.mode == SAME_TASK:
            g = failed.generation + 1
            fresh = Group(failed.task_index, g, group_keys(failed.task_index, g, self.n))
        elif self._pool:
            u = self._pool.pop(0)
            fresh = Group(u, 0, group_keys(u, 0, self.n))
        else:
            self.short += 1
            return None
        self.replaced += 1
        return fresh

    def why_short(self) -> str:
        """The shortfall in one line ("" when there is none)."""
        if not self.short:
            return ""
        if self.mode == NEXT_TASK and not self._pool and self.replaced < self.bound_left:
            cause = "the dataset has no unused task left"
        else:
            cause = f"the bound of {self.bound} replacements was used up"
        return (
            f"{self.short} failed group(s) of {self.groups} could not be replaced ({cause}; raise it "
            "with --max-replacements): the trainer got fewer full groups than the job has tasks"
        )
