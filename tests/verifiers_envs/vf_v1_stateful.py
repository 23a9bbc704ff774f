"""A verifiers 0.4 taskset whose Toolset keeps a State of its own (a counter the tools change):
verifiers syncs such state between the Toolsets and the trace that scoring reads; the rollmesh bridge
syncs none, so it refuses the taskset by name."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf
from pydantic_config import BaseConfig


class CounterState(vf.State):
    count: int = 0


class CounterConfig(BaseConfig):
    pass


class Counter(vf.Toolset[CounterConfig, CounterState]):
    @vf.tool
    def increment(self, by: int) -> int:
        """Add to the counter."""
        self.state.count += by
        return self.state.count


class CountTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Counter(CounterConfig())]

    @vf.reward
    async def said_something(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply else 0.0


class CountTaskset(vf.Taskset[CountTask, vf.TasksetConfig]):
    def load(self) -> Iterable[CountTask]:
        yield CountTask(vf.TaskData(prompt="Add 2 to the counter."), self.config.task)


__all__ = ["CountTaskset"]
