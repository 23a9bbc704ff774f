"""verifier/sandbox/clock.py: a run that ends while its processes are being read at the deadline
keeps the credit that reading gives it (the report says the time it was given), and none when its
own processes competed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rollmesh.verifier.sandbox import clock
from rollmesh.verifier.sandbox.clock import WallCredit
from rollmesh.verifier.sandbox.clock import run_within_wall_time


async def _ends_while_read(monkeypatch: pytest.MonkeyPatch, used: float, waited: float) -> WallCredit:
    """A run past its 0.5 s limit that ends while the deadline's /proc reading is under way, the
    reading saying (`used`, `waited`)."""
    loop = asyncio.get_running_loop()
    ended = asyncio.Event()
    finished = threading.Event()

    async def code() -> str:
        await ended.wait()
        finished.set()
        return "ok"

    def reading(session: int, skip: int = 0) -> tuple[float, float]:
        loop.call_soon_threadsafe(ended.set)  # the run ends ...
        assert finished.wait(30)  # ... before the reading is back
        return used, waited

    monkeypatch.setattr(clock, "session_cpu", reading)
    credit = WallCredit()
    assert await run_within_wall_time(code(), 0, 0.5, credit) == "ok"
    return credit


async def test_a_run_that_ends_while_read_keeps_the_time_it_waited_for_a_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    credit = await _ends_while_read(monkeypatch, used=0.05, waited=0.4)
    assert credit.waited_s == 0.4  # was 0.0: the report said no time was given past the limit


async def test_a_run_whose_own_processes_competed_gets_no_credit_then_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    credit = await _ends_while_read(monkeypatch, used=5.0, waited=0.4)
    assert credit.waited_s == 0.0
