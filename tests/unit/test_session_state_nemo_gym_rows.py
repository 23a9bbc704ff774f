"""The built-in `session_state` environment runs NeMo Gym's example_session_state_mgmt rows as they
are (`initial_count` / `expected_count` on the row; 0.4.0's data/example.jsonl, via the
nemo_gym_servers fixture): each prompt's additions reach the expected count, one less does not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.verifier import BadTask
from rollmesh.verifier.environment import Task
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import call
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import seeded

SESSION_STATE = BUILTIN_ROOT / "environments" / "session_state"


async def test_nemo_gym_session_rows_reach_their_expected_count(nemo_gym_servers: Path) -> None:
    path = nemo_gym_servers / "example_session_state_mgmt" / "data" / "example.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 5
    async with load_env(SESSION_STATE) as env:
        for n, row in enumerate(rows):
            prompt = row["responses_create_params"]["input"][0]["content"]  # "add 1 then add 2 then get ..."
            counts = [int(c) for c in re.findall(r"add (-?\d+)", prompt)]
            for short in (False, True):
                t = Task(row)
                s = await seeded(env, t, f"s{n}{short}")
                assert (await env.call_tool(s, call("get_counter_value", {}))).output == str(
                    row["initial_count"]
                )
                for c in counts:
                    await env.call_tool(s, call("increment_counter", {"count": c - (1 if short else 0)}))
                verdict = await check(env, t, answer(""), s)
                assert verdict.reward == (0.0 if short else 1.0), (row, verdict.details)


async def test_a_row_whose_counts_are_not_integers_is_a_bad_task() -> None:
    async with load_env(SESSION_STATE) as env:
        with pytest.raises(BadTask, match="initial_count is not an integer"):
            await seeded(env, Task({"initial_count": "three", "expected_count": 3}))
        t = Task({"initial_count": 3, "expected_count": "six"})
        with pytest.raises(BadTask, match="no integer expected_answer nor expected_count"):
            await check(env, t, answer(""), await seeded(env, t))
