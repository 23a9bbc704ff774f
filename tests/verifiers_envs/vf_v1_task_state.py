"""A verifiers 0.4 taskset whose task keeps a State of its own (set up by the task, synced with its
toolsets and read by scoring): the rollmesh bridge runs no task setup and syncs no state, so it
refuses the taskset by name."""

from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf


class NotesState(vf.State):
    last_note: str = ""


class NotesTask(vf.Task[vf.TaskData, NotesState, vf.TaskConfig]):
    @vf.reward
    async def said_something(self, trace: vf.Trace) -> float:
        return 1.0 if trace.last_reply else 0.0


class NotesTaskset(vf.Taskset[NotesTask, vf.TasksetConfig]):
    def load(self) -> Iterable[NotesTask]:
        yield NotesTask(vf.TaskData(prompt="Take a note."), self.config.task)


__all__ = ["NotesTaskset"]
