"""A verifiers 0.4 (`verifiers.v1`) taskset: compute (A + B) * C with a local Toolset's `add` and
`multiply` tools; a weighted reward pays 1.0 for the right number in the last reply, and a second
reward 0.5 per tool the model called (weight 0.5)."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf
from pydantic_config import BaseConfig


class CalcData(vf.TaskData):
    answer: str


class CalcToolsConfig(BaseConfig):
    pass


class Calc(vf.Toolset[CalcToolsConfig, vf.State]):
    TOOL_PREFIX = None  # the tools are offered bare: `add`, `multiply`

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [Calc(CalcToolsConfig())]

    @vf.reward
    async def correct(self, trace: vf.Trace) -> float:
        words = trace.last_reply.rstrip(".").split()
        return 1.0 if self.data.answer in words else 0.0

    @vf.reward(weight=0.5)
    async def used_tools(self, trace: vf.Trace) -> float:
        names = {c.name for m in trace.assistant_messages for c in m.tool_calls or []}
        return len(names & {"add", "multiply"}) / 2


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    def load(self) -> Iterable[CalcTask]:
        for a, b, c in [(2, 3, 4), (5, 7, 2), (1, 1, 3), (6, 0, 3)]:
            data = CalcData(
                prompt=f"Compute ({a} + {b}) * {c}.",
                system_prompt="Use the tools, then give the number.",
                answer=str((a + b) * c),
            )
            yield CalcTask(data, self.config.task)


__all__ = ["CalcTaskset"]
