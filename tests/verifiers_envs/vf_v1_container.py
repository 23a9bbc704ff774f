"""A verifiers 0.4 taskset whose task needs a container (`NEEDS_CONTAINER`): the rollmesh bridge
runs none, so it refuses the taskset by name."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf


class BoxTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    NEEDS_CONTAINER = True

    @vf.reward
    async def said_something(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply else 0.0


class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):
    def load(self) -> Iterable[BoxTask]:
        yield BoxTask(vf.TaskData(prompt="List the files."), self.config.task)


__all__ = ["BoxTaskset"]
