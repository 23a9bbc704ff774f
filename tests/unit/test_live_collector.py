"""LiveCollector: gauges read off live objects; several objects with the same labels combine."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client import REGISTRY

from rollmesh.mesh.metrics import LiveCollector


@dataclass(eq=False)  # held in a WeakSet: hashed by identity, as the services are
class Thing:
    in_flight: float
    version: float


def collected(*things: Thing) -> dict[str, float]:
    """What one scrape reads off `things` (a collector registered for the call only)."""

    def read(t: Thing) -> list[tuple[str, dict[str, str], float]]:
        return [
            ("t_live_in_flight", {"model": "m"}, t.in_flight),
            ("t_live_version", {"model": "m"}, t.version),
        ]

    docs = {"t_live_in_flight": "in flight", "t_live_version": "version"}
    live = LiveCollector(read, docs, newest=frozenset({"t_live_version"}))
    try:
        for t in things:
            live.watch(t)
        return {m.name: m.samples[0].value for m in live.collect()}
    finally:
        REGISTRY.unregister(live)


def test_amounts_add_up_and_a_version_is_the_newest_known_one() -> None:
    # A process holding two gateways (a test's leftover one with a non-integer label beside the live
    # one) read the version as their sum, NaN + 3: NaN.
    things = [Thing(2, math.nan), Thing(5, 3), Thing(1, 1)]
    assert collected(*things) == {"t_live_in_flight": 8, "t_live_version": 3}
    assert math.isnan(collected(things[0])["t_live_version"])
