"""How `make test` spreads the suite over pytest-xdist workers (`pytest -n N --dist loadgroup`; the
hook in tests/conftest.py calls `group_by_file` there). A serial run is unchanged.

- A test file is one group: its tests run on one worker, in the file's order, so what its module-
  and session-scoped fixtures start (servers, a mesh, `rollmesh up`, a Ray, a NeMo Gym server) starts
  once for the file, as in a serial run. Files share nothing else: ports are ephemeral, results go to
  each test's tmp_path, and the caches (~/.cache/rollmesh) are built under file locks.
- Every file with a test that runs a real vLLM engine (marked `slow`: Ray Serve + vLLM on CPU) is
  in one group, `ENGINES`: one engine runs at a time, as in a serial run (each engine wants every
  core; two at once on two cores starve each other past their tests' bounds).
- Groups are handed out in collection order (`--no-loadscope-reorder`), which this puts longest
  first: `ENGINES`, then the files in `LONG_FIRST` (the slowest files of a measured run,
  docs/testing.md), then the rest as collected; so no long file starts last and runs alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

ENGINES = "real-vllm-engines"
#: Files that take minutes (measured, slowest first): started before the many short ones.
LONG_FIRST: Sequence[str] = ()


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def group_by_file(items: list[pytest.Item]) -> None:
    """Mark each item with its xdist group and order the items longest group first (in place)."""
    engine_files = {_file(i) for i in items if i.get_closest_marker("slow") is not None}
    rank = {name: n for n, name in enumerate(LONG_FIRST, start=1)}

    def group(item: pytest.Item) -> str:
        return ENGINES if _file(item) in engine_files else _file(item)

    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
    items.sort(key=lambda i: 0 if group(i) == ENGINES else rank.get(group(i), len(rank) + 1))
