"""A verifiers 0.4 taskset the rollmesh bridge cannot run faithfully: its task has a `@vf.stop` hook
(rollmesh's loop runs none) and a reward that needs a runtime (verifiers skips it when scoring
without one). The bridge refuses it by name instead of scoring without them."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf


class StopTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.stop
    async def enough(self, trace: vf.Trace) -> bool:
        return len(trace.assistant_messages) >= 2

    @vf.reward
    async def in_box(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0


class StopTaskset(vf.Taskset[StopTask, vf.TasksetConfig]):
    def load(self) -> Iterable[StopTask]:
        yield StopTask(vf.TaskData(prompt="Say hi."), self.config.task)


__all__ = ["StopTaskset"]
