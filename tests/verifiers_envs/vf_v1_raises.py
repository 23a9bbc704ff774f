"""A verifiers 0.4 (`verifiers.v1`) taskset whose reward raises on one task ("What is 10 + 5?") and
scores the others. verifiers 0.4 raises a TaskError out of `Task.score` for it; the bridge must fail
that verify by name (REWARD_FUNCTION_FAILED), never store a reward of 0."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        if self.data.answer == "15":
            raise RuntimeError("the grader's lookup table has no entry for 15")
        return 1.0 if self.data.answer in trace.last_reply.rstrip(".").split() else 0.0


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self) -> Iterable[SumTask]:
        for a, b in [(2, 3), (10, 5)]:
            yield SumTask(SumData(prompt=f"What is {a} + {b}?", answer=str(a + b)), self.config.task)


__all__ = ["SumTaskset"]
