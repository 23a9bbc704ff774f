"""A verifiers 0.4 taskset whose reward needs a runtime (a sandbox): verifiers skips it when it scores
without one, as the bridge scores, so the bridge refuses the taskset by name instead of leaving the
reward out of the score."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf


class RunTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def said_something(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply else 0.0

    @vf.metric
    async def files_made(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0


class RunTaskset(vf.Taskset[RunTask, vf.TasksetConfig]):
    def load(self) -> Iterable[RunTask]:
        yield RunTask(vf.TaskData(prompt="Make a file."), self.config.task)


__all__ = ["RunTaskset"]
