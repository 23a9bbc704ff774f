"""`Cut`: the cancel scope of one awaited call, as `asyncio.timeout` gives one, without building a
`Timeout` (its state enum, its async context manager) per call: the scheduler brackets four scopes
of every rollout with one (the attempt's deadline, retry.py; the model call's adaptive deadline,
deadline.py; the watchdog's hang cut of each call, watchdog.py), ~1.3 us less each.

`Cut(task)` notes the task's cancel requests; `at(when, loop)` schedules the cut at loop time `when`
(None: never; now or past: on the loop's next turn), moving one already scheduled; firing cancels the
task (`cut` is then True, and stays). The caller calls `ended(exc)` when the call ends, with its
exception (None: it returned): True when that is this cut's CancelledError, i.e. no other cancel
request came meanwhile (the same test a Timeout's exit makes before it raises TimeoutError); the
caller then raises its own error in its place (`by_cut(exc)`: that, or the call's own TimeoutError
raised as it was cut). A cut that fired or ended is spent: `at` does nothing then (a Timeout's
`reschedule` raised), so a stale cut can never cancel the task again.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Cut:
    __slots__ = ("_cancelling", "_ended", "_handle", "_task", "_when", "cut")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._cancelling = task.cancelling()
        self._handle: asyncio.Handle | None = None
        self._when: float | None = None
        self._ended = False
        self.cut = False

    def when(self) -> float | None:
        """The loop time the cut is scheduled for (None: none)."""
        return self._when

    def at(self, when: float | None, loop: asyncio.AbstractEventLoop) -> None:
        """Cut at loop time `when` (None: never; now or past: on the loop's next turn); nothing once
        the cut fired or ended."""
        if self.cut or self._ended:
            return
        self._when = when
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if when is not None:
            self._handle = (
                loop.call_soon(self._fire) if when <= loop.time() else loop.call_at(when, self._fire)
            )

    def _fire(self) -> None:
        self._handle = None
        self._task.cancel()
        self.cut = True

    def ended(self, exc: BaseException | None) -> bool:
        """The call ended with `exc` (None: it returned). True: its CancelledError is this cut's."""
        self._ended = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        return self.cut and self._task.uncancel() <= self._cancelling and type(exc) is asyncio.CancelledError

    def by_cut(self, exc: BaseException | None) -> bool:
        """`ended(exc)`, and True also for the call's own TimeoutError raised as it was cut (an inner
        timeout that saw this cut's cancel)."""
        return self.ended(exc) or (self.cut and isinstance(exc, TimeoutError))


def current_task() -> asyncio.Task[Any]:
    """The running task (a Cut cancels it): RuntimeError outside one, as asyncio.timeout raises."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("a Cut needs to run inside a task")
    return task
