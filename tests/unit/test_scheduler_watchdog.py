"""Watchdog.watch (scheduler/watchdog.py) as one call sees it: a call the watchdog cuts ends as the
service's error, once; every other end (a result, its own error, its own TimeoutError before a cut, a
cancel from outside, even one that comes after the cut) is the call's own, as with the
`asyncio.timeout(None)` the watchdog used to wrap each call in; the outage clock hears each end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollmesh.scheduler.errors import GatewayUnresponsive
from rollmesh.scheduler.retry import Outages
from rollmesh.scheduler.watchdog import GATEWAY
from rollmesh.scheduler.watchdog import Watchdog


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _watchdog() -> tuple[Watchdog, _Clock]:
    clock = _Clock()
    return Watchdog(Outages(1.0, clock=clock), {GATEWAY: None}), clock


async def _started(task: asyncio.Task[Any]) -> None:
    for _ in range(3):
        await asyncio.sleep(0)
    assert not task.done()


async def _hang(seconds: float = 3600) -> str:
    await asyncio.sleep(seconds)
    return "late"


async def _cut(wd: Watchdog, clock: _Clock) -> None:
    """The gateway quiet past the budget: the check cuts its calls (on the loop's next turn)."""
    clock.now += 2.0
    await wd.check()


async def test_a_call_that_answers_or_fails_on_its_own_is_its_own() -> None:
    wd, _ = _watchdog()
    assert await wd.watch(GATEWAY, asyncio.sleep(0, "ok")) == "ok"

    async def fails() -> None:
        raise ValueError("its own")

    with pytest.raises(ValueError, match="its own"):
        await wd.watch(GATEWAY, fails())

    async def times_out() -> None:
        raise TimeoutError("its own deadline")

    with pytest.raises(TimeoutError, match="its own deadline"):
        await wd.watch(GATEWAY, times_out())
    assert wd.outages.quiet_s(GATEWAY) is None and not wd._calls[GATEWAY]


async def test_a_cut_call_ends_as_the_service_hanging_once_and_the_task_is_not_left_cancelled() -> None:
    wd, clock = _watchdog()
    task = asyncio.create_task(wd.watch(GATEWAY, _hang()))
    await _started(task)
    await _cut(wd, clock)
    await _cut(wd, clock)  # a second check before the cut lands cuts nothing more
    with pytest.raises(GatewayUnresponsive) as info:
        await task
    assert info.value.message == "the gateway answered none of 1 call for 4 s"  # (the last check)
    assert task.cancelling() == 0 and GATEWAY in wd.outages.down and not wd._calls[GATEWAY]


async def test_a_cut_the_call_meets_with_its_own_timeout_error_is_the_service_hanging() -> None:
    wd, clock = _watchdog()

    async def own_timeout() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise TimeoutError("its own") from None

    task = asyncio.create_task(wd.watch(GATEWAY, own_timeout()))
    await _started(task)
    await _cut(wd, clock)
    with pytest.raises(GatewayUnresponsive):
        await task


async def test_a_cancel_from_outside_stays_a_cancel_even_with_a_cut() -> None:
    wd, clock = _watchdog()
    task = asyncio.create_task(wd.watch(GATEWAY, _hang()))
    await _started(task)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wd.outages.quiet_s(GATEWAY) is None and not wd._calls[GATEWAY]

    task = asyncio.create_task(wd.watch(GATEWAY, _hang()))
    await _started(task)
    await _cut(wd, clock)
    task.cancel()  # another cancel request before the cut lands: the caller's, not the watchdog's
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not wd._calls[GATEWAY]


async def test_a_call_that_answers_before_its_cut_lands_keeps_its_answer() -> None:
    wd, clock = _watchdog()
    task = asyncio.create_task(wd.watch(GATEWAY, _hang(0)))
    clock.now += 2.0
    await asyncio.sleep(0)  # the call is waiting on its sleep(0)
    await wd.check()  # schedules the cut for the loop's next turn; the call ends first
    assert await task == "late" and task.cancelling() == 0
