"""How `make test` spreads the suite over pytest-xdist workers (`pytest -n N --dist loadgroup`; the
hooks in tests/conftest.py call this). A serial run is unchanged.

- A test file is one group: its tests run on one worker, in the file's order, so what its module-
  and session-scoped fixtures start (servers, a mesh, `rollmesh up`, a Ray, a NeMo Gym server) starts
  once for the file, as in a serial run. Files share nothing else: ports are ephemeral, results go to
  each test's tmp_path, and the caches (~/.cache/rollmesh) are built under file locks. A file whose
  tests run once per value of a module- or session-scoped parametrized fixture (NeMo Gym 0.4.0 and
  0.7.0, the sandbox's two modes) is a group per value: that fixture starts once per value anyway.
- Every test that runs a real vLLM engine (marked `slow`: Ray Serve + vLLM on CPU) is in one group,
  `ENGINES`: one engine runs at a time, as in a serial run (each engine wants every core; two at once
  on two cores starve each other past their tests' bounds). The other tests of such a file stay in
  its own group (a fixture both kinds use starts once on each worker).
- Groups are handed out in collection order (`--no-loadscope-reorder`), which this puts longest
  first: `ENGINES`, then the files in `LONG_FIRST`, then the rest as collected; so no long file
  starts last and runs alone.

How the groups reach the scheduler: xdist's own `loadgroup` reads them from a suffix it writes into
each test's node id, which pytest >= 9.2 no longer takes (pytest-xdist#1386: every test became its
own group). So each worker writes its tests' groups to a file (`write_groups`, in the folder the
controller names in `GROUPS_ENV`) and the controller's scheduler (`FileGroupScheduling`, xdist's
load-scope scheduler keyed by those groups) reads them once every worker has collected.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

ENGINES = "real-vllm-engines"
#: Files that take minutes (slowest first; measured in a full `make test` on 4 workers on a loaded
#: 2-core machine, 2026-11-29): started before the many short ones.
LONG_FIRST: Sequence[str] = (
    "tests/multinode/test_join_cluster.py",
    "tests/integration/test_verifiers_envs.py",
    "tests/integration/test_nemo_gym_servers.py",  # a group per NeMo Gym version
    "tests/multinode/test_cluster_jobs.py",
    "tests/e2e/test_reasoning_gym_docs.py",
    "tests/integration/test_verifier_sandbox.py",
    "tests/e2e/test_grpo_arith_example.py",
    "tests/e2e/test_cli_hostile_input.py",
    "tests/e2e/test_up_faults.py",
    "tests/integration/test_code_forgery.py",
    "tests/integration/test_verifiers_v1.py",
    "tests/e2e/test_auth_mesh.py",
    "tests/integration/test_results_grpc_sink.py",
    "tests/e2e/test_docs_commands.py",  # ~1 min alone, 2026-11-29 (not yet in a measured full run)
)
#: The folder where each worker writes its tests' groups (set by the controller for its workers).
GROUPS_ENV = "ROLLMESH_TEST_GROUPS_DIR"
#: The controller's own COLUMNS and LINES, for its workers (`restore_terminal_env`).
TERMINAL_ENV = "ROLLMESH_TEST_TERMINAL"
_TERMINAL = ("COLUMNS", "LINES")


def export_terminal_env() -> None:
    """On the controller, before its workers start: its COLUMNS and LINES (absent: null)."""
    os.environ[TERMINAL_ENV] = json.dumps({k: os.environ.get(k) for k in _TERMINAL})


def restore_terminal_env() -> None:
    """On a worker: the controller's COLUMNS and LINES. xdist's workers start with COLUMNS=80 and
    LINES=24, which a serial run does not have: rich (the CLI's tables; `make run` in a tmux of
    another width) then takes 80 columns whatever the terminal or the test sets."""
    for key, value in json.loads(os.environ.get(TERMINAL_ENV) or "{}").items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _wide_params(item: pytest.Item) -> str:
    """The values of the item's parametrized fixtures scoped wider than a test ("" when none)."""
    callspec = getattr(item, "callspec", None)
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if callspec is None:
        return ""
    wide = [
        f"{name}={value}"
        for name, value in sorted(callspec.params.items())
        if name in defs and defs[name][-1].scope in ("module", "package", "session")
    ]
    return f"[{','.join(wide)}]" if wide else ""


def group_of(item: pytest.Item) -> str:
    if item.get_closest_marker("slow") is not None:
        return ENGINES
    return _file(item) + _wide_params(item)


def order_longest_first(items: list[pytest.Item]) -> None:
    """`ENGINES` first, then `LONG_FIRST`'s files, then the rest in collection order (in place)."""
    rank = {name: n for n, name in enumerate(LONG_FIRST, start=1)}
    items.sort(key=lambda i: 0 if group_of(i) == ENGINES else rank.get(_file(i), len(rank) + 1))


def write_groups(items: list[pytest.Item]) -> None:
    """On a worker: its tests' groups, `{node id: group}`, into `$GROUPS_ENV/<worker>.json`."""
    folder, worker = os.environ.get(GROUPS_ENV), os.environ.get("PYTEST_XDIST_WORKER")
    if not folder or not worker:
        return
    path = Path(folder) / f"{worker}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
    tmp.rename(path)


def read_groups(folder: Path) -> dict[str, str]:
    """On the controller: every worker's `{node id: group}` (`write_groups`)."""
    groups: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        groups.update(json.loads(path.read_text()))
    return groups


def scope_of(groups: dict[str, str], nodeid: str) -> str:
    """A test's group (its file when no worker named one)."""
    return groups.get(nodeid) or nodeid.split("::", 1)[0]


class FileGroupScheduling(LoadScopeScheduling):
    """xdist's load-scope scheduling (a scope's tests go to one worker, whole), scoped by the groups
    the workers wrote (`write_groups`); a test none names is scoped by its file."""

    def __init__(self, config: pytest.Config, log: Any = None, *, folder: Path) -> None:
        super().__init__(config, log)
        self._folder = folder
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # first called once every worker has collected (and written)
            self._groups = read_groups(self._folder)
        return scope_of(self._groups, nodeid)
