"""Fixtures of the multi-host tests: a network-namespace lab (skipped, with the reason, where this
machine cannot create one) and its tear-down, which runs even when a test fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multinode.netns import LabUnavailable
from tests.multinode.netns import NetnsLab


@pytest.fixture(scope="module")
def lab() -> Iterator[NetnsLab]:
    try:
        created = NetnsLab.create()
    except LabUnavailable as exc:
        pytest.skip(f"multi-host lab unavailable: {exc}")
    try:
        yield created
    finally:
        created.close()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lab")
