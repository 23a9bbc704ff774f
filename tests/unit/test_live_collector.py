"""LiveCollector: gauges read off live objects through the bound methods they register; several
objects with the same labels combine; a dropped object stops being read."""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass

import pytest
from prometheus_client import REGISTRY

from rollmesh.mesh.metrics import LiveCollector


@dataclass(eq=False)  # held weakly: hashed by identity, as the services are
class Thing:
    in_flight: float
    version: float

    def now(self) -> tuple[float, float]:
        return self.in_flight, self.version


DOCS = {"t_live_in_flight": "in flight", "t_live_version": "version"}


def read(now: tuple[float, float]) -> list[tuple[str, dict[str, str], float]]:
    return [("t_live_in_flight", {"model": "m"}, now[0]), ("t_live_version", {"model": "m"}, now[1])]


def collected(*things: Thing) -> dict[str, float]:
    """What one scrape reads off `things` (a collector registered for the call only)."""
    live = LiveCollector(read, DOCS, newest=frozenset({"t_live_version"}))
    try:
        for t in things:
            live.watch(t.now)
        return {m.name: m.samples[0].value for m in live.collect()}
    finally:
        REGISTRY.unregister(live)


def test_amounts_add_up_and_a_version_is_the_newest_known_one() -> None:
    # A process holding two gateways (a test's leftover one with a non-integer label beside the live
    # one) read the version as their sum, NaN + 3: NaN.
    things = [Thing(2, math.nan), Thing(5, 3), Thing(1, 1)]
    assert collected(*things) == {"t_live_in_flight": 8, "t_live_version": 3}
    assert math.isnan(collected(things[0])["t_live_version"])


def test_a_dropped_object_is_no_longer_read_and_watch_takes_only_a_bound_method() -> None:
    live = LiveCollector(read, DOCS)
    try:
        kept, dropped = Thing(2, 1), Thing(5, 1)
        live.watch(kept.now)
        live.watch(dropped.now)
        assert {m.name: m.samples[0].value for m in live.collect()}["t_live_in_flight"] == 7
        del dropped
        gc.collect()
        assert {m.name: m.samples[0].value for m in live.collect()}["t_live_in_flight"] == 2
        with pytest.raises(TypeError, match="bound method"):
            live.watch(lambda: (1.0, 1.0))
    finally:
        REGISTRY.unregister(live)
