"""`rollmesh reverify --tasks`: stored rollouts joined back to their dataset rows by input messages."""

from __future__ import annotations

import pytest

from rollmesh.commands._reverify import join_tasks


def task(text: str, **fields: object) -> dict[str, object]:
    return {"responses_create_params": {"input": [{"role": "user", "content": text}]}, **fields}


def test_a_recorded_rollout_is_scored_as_its_row_with_what_the_rollout_added() -> None:
    tasks = [task("add 1", expected_count=4, initial_count=3), task("add 2", expected_count=5)]
    recorded = {
        # materialized params (a null field, content as parts) and the recorded verdict's own fields
        "responses_create_params": {
            "input": [
                {"role": "user", "type": "message", "content": [{"type": "input_text", "text": "add 1"}]}
            ],
            "temperature": None,
        },
        "response": {"output": []},
        "reward": 1.0,
        "library_reward": 1.0,
        "_ng_task_index": 0,
    }
    rows, unmatched = join_tasks([recorded, task("add 9", reward=0.0)], tasks)
    assert unmatched == 1
    assert rows[0] == {**tasks[0], "response": {"output": []}, "reward": 1.0, "_ng_task_index": 0}
    assert rows[1] == task("add 9", reward=0.0)


def test_two_different_rows_with_one_input_are_refused() -> None:
    with pytest.raises(ValueError, match="share the input"):
        join_tasks([], [task("x", a=1), task("x", a=2)])
    assert join_tasks([task("x", reward=1.0)], [task("x", a=1), task("x", a=1)])[1] == 0
