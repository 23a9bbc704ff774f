"""A verifiers 0.4 (`verifiers.v1`) taskset scored by a judge given as config: the built-in
`reference` judge (plugged in verifiers.toml's [[config.task.judges]]) asks an OpenAI-compatible
model whether the reply matches the answer; a metric counts the reply's words (recorded, not summed)."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf


class QaData(vf.TaskData):
    answer: str


class QaTask(vf.Task[QaData, vf.State, vf.TaskConfig]):
    @vf.metric
    async def reply_words(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()))


class QaTaskset(vf.Taskset[QaTask, vf.TasksetConfig]):
    def load(self) -> Iterable[QaTask]:
        for a, b in [(2, 2), (7, 5), (3, 4)]:
            yield QaTask(QaData(prompt=f"What is {a} + {b}?", answer=str(a + b)), self.config.task)


__all__ = ["QaTaskset"]
