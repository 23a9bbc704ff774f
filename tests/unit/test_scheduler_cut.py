"""scheduler/cut.py: a call's cancel scope as asyncio.timeout's, without the Timeout: scheduled at a
loop time (or never), moved, fired on the loop's next turn when due; `ended` says whether the call's
CancelledError is the cut's (not when another cancel request came meanwhile)."""

from __future__ import annotations

import asyncio

import pytest

from rollmesh.scheduler.cut import Cut
from rollmesh.scheduler.cut import current_task


async def _scoped(seconds: float, *whens: float | None) -> tuple[str, Cut]:
    """Sleep `seconds` under a cut scheduled at each of `whens` in turn (the last one holds)."""
    loop = asyncio.get_running_loop()
    cut = Cut(current_task())
    for when in whens:
        cut.at(when, loop)
    try:
        await asyncio.sleep(seconds)
    except BaseException as exc:
        if cut.ended(exc):
            return "cut", cut
        raise
    cut.ended(None)
    return "done", cut


async def test_a_cut_fires_when_due_never_when_none_and_can_be_moved() -> None:
    now = asyncio.get_running_loop().time()
    assert (await _scoped(0.01, None))[0] == "done"
    outcome, cut = await _scoped(0.01, now + 3600)
    assert outcome == "done" and not cut.cut and cut.when() == now + 3600
    outcome, cut = await _scoped(3600, now - 1)  # already due: on the loop's next turn
    assert outcome == "cut" and cut.cut
    outcome, cut = await _scoped(3600, now + 3600, now + 0.01)
    assert outcome == "cut" and cut.when() == now + 0.01
    outcome, cut = await _scoped(0.05, now + 0.01, None)
    assert outcome == "done" and not cut.cut and current_task().cancelling() == 0


async def test_another_cancel_request_wins_over_the_cut_and_the_task_is_left_as_it_was() -> None:
    task = asyncio.create_task(_scoped(3600, asyncio.get_running_loop().time() - 1))
    await asyncio.sleep(0)  # the task started, its cut is due on the next turn
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    done = asyncio.create_task(_scoped(3600, asyncio.get_running_loop().time() - 1))
    outcome, cut = await done
    assert outcome == "cut" and cut.cut and done.cancelling() == 0


async def test_a_cut_that_fired_or_ended_is_spent_and_never_cancels_the_task_again() -> None:
    """A stale cut (an attempt's, seen later through a copied context) must not re-arm: asyncio's
    Timeout raised on such a reschedule; a Cut ignores it."""
    loop = asyncio.get_running_loop()
    outcome, cut = await _scoped(0.01, loop.time() + 3600)  # ended without firing
    assert outcome == "done"
    cut.at(loop.time() - 1, loop)
    await asyncio.sleep(0.02)  # past when it would have fired
    assert not cut.cut and current_task().cancelling() == 0
    outcome, cut = await _scoped(3600, loop.time() - 1)  # fired
    assert outcome == "cut" and cut.cut
    cut.at(loop.time() - 1, loop)
    await asyncio.sleep(0.02)
    assert current_task().cancelling() == 0


async def test_by_cut_is_the_cut_or_the_calls_own_timeout_raised_as_it_was_cut() -> None:
    loop = asyncio.get_running_loop()
    cut = Cut(current_task())
    cut.at(loop.time() - 1, loop)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass
    assert cut.by_cut(TimeoutError()) and current_task().cancelling() == 0
    quiet = Cut(current_task())
    assert not quiet.by_cut(TimeoutError()) and not quiet.by_cut(None)
