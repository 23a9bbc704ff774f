"""freeze_startup_heap: what lives at start-up leaves the collector's generations."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from rollmesh.mesh.heap import freeze_startup_heap


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as before


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def _tracked(obj: object) -> bool:
    return any(o is obj for o in gc.get_objects())


@pytest.mark.usefixtures("unfrozen")
def test_objects_alive_at_startup_are_frozen_and_garbage_is_collected_first() -> None:
    alive: list[object] = [{"startup": True}]
    dropped = weakref.ref(_Node())  # garbage: the full collection frees it before the freeze

    frozen = freeze_startup_heap()

    # frozen objects freed meanwhile (another thread of the suite's process) leave the count: <=
    assert 0 < gc.get_freeze_count() <= frozen
    assert not _tracked(alive)  # in the permanent generation: no collection scans it again
    assert dropped() is None
    later: list[object] = [{"request": True}]
    assert _tracked(later)  # what requests allocate is still collected
