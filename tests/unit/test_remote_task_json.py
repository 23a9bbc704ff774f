"""The task text the scheduler sends the verifier (remote.py `_task_json`, one encoder made once) is
json.dumps(task, ensure_ascii=False)'s, as it was."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rollmesh.scheduler.remote import _task_json

_ROWS = sorted(
    Path(__file__).resolve().parents[2].glob("services/rollmesh/builtin/environments/*/data/example.jsonl")
)


@pytest.mark.parametrize(
    "task",
    [
        *(json.loads(line) for path in _ROWS for line in path.read_text().splitlines() if line.strip()),
        {
            "é": "ü\u2028\x00",
            "xs": [1.5, math.nan, -math.inf, 1e16, 1e-5, 10**30],
            "t": (1, None, True),
            1: {},
        },
        {},
    ],
)
def test_the_task_text_is_json_dumps(task: dict[Any, Any]) -> None:
    assert _task_json(task) == json.dumps(task, ensure_ascii=False)
