"""tests/parallel.py: how `make test` groups the suite for its xdist workers (each file one group, a
wide-scoped parameter's values apart, every real-vLLM test in one group, longest first) and how the
groups get from the workers to the controller's scheduler (a file per worker)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest

from tests import parallel


@dataclass
class Scoped:
    scope: str


@dataclass
class FakeItem:
    """What the grouping reads of a pytest item."""

    nodeid: str
    slow: bool = False
    params: dict[str, Any] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None

    @property
    def callspec(self) -> Any:
        return type("CallSpec", (), {"params": self.params})() if self.params else None

    @property
    def _fixtureinfo(self) -> Any:
        return type("Info", (), {"name2fixturedefs": {k: [Scoped(v)] for k, v in self.scopes.items()}})()


def items() -> list[Any]:
    return [
        FakeItem("tests/unit/test_a.py::test_one"),
        FakeItem("tests/unit/test_a.py::test_two[x]", params={"x": 1}, scopes={"x": "function"}),
        FakeItem("tests/e2e/test_b.py::test_engine", slow=True),
        FakeItem("tests/e2e/test_b.py::test_plain"),
        FakeItem(
            "tests/integration/test_nemo_gym_servers.py::t[0.4.0]",
            params={"v": "0.4.0"},
            scopes={"v": "session"},
        ),
        FakeItem(
            "tests/integration/test_nemo_gym_servers.py::t[0.7.0]",
            params={"v": "0.7.0"},
            scopes={"v": "module"},
        ),
    ]


def test_a_file_is_a_group_its_real_vllm_tests_join_the_engines_and_wide_params_split_it() -> None:
    got = [parallel.group_of(i) for i in items()]
    assert got == [
        "tests/unit/test_a.py",
        "tests/unit/test_a.py",  # a test-scoped parameter keeps the file whole
        parallel.ENGINES,
        "tests/e2e/test_b.py",
        "tests/integration/test_nemo_gym_servers.py[v=0.4.0]",
        "tests/integration/test_nemo_gym_servers.py[v=0.7.0]",
    ]


def test_the_engines_then_the_long_files_then_the_rest_in_collection_order() -> None:
    ordered = items()
    parallel.order_longest_first(ordered)
    assert [i.nodeid.split("::")[0] for i in ordered] == [
        "tests/e2e/test_b.py",  # its real-vLLM test: the engines' group
        "tests/integration/test_nemo_gym_servers.py",  # in LONG_FIRST
        "tests/integration/test_nemo_gym_servers.py",
        "tests/unit/test_a.py",
        "tests/unit/test_a.py",
        "tests/e2e/test_b.py",
    ]


def test_the_workers_groups_reach_the_scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.GROUPS_ENV, str(tmp_path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    parallel.write_groups(items())
    groups = parallel.read_groups(tmp_path)
    assert parallel.scope_of(groups, "tests/e2e/test_b.py::test_engine") == parallel.ENGINES
    assert parallel.scope_of(groups, "tests/unit/test_a.py::test_two[x]") == "tests/unit/test_a.py"
    assert parallel.scope_of(groups, "tests/unit/test_new.py::t") == "tests/unit/test_new.py"  # none named it
    assert [p.name for p in tmp_path.iterdir()] == ["gw1.json"]


def test_a_serial_run_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(parallel.GROUPS_ENV, str(tmp_path))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    parallel.write_groups(items())
    assert not list(tmp_path.iterdir())


def test_a_worker_takes_the_controllers_terminal_size_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """xdist's workers start with COLUMNS=80 LINES=24: a worker drops what the controller did not have."""
    monkeypatch.setenv(parallel.TERMINAL_ENV, "")  # (restored after the test)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("LINES", "50")
    parallel.export_terminal_env()
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    parallel.restore_terminal_env()
    assert "COLUMNS" not in os.environ and os.environ["LINES"] == "50"
