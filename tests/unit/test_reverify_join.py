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


class _Down:
    """A verifier port whose every call finds the verifier unreachable (or never answers)."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang

    async def seed_session(self, *args: object) -> object:
        import asyncio

        from rollmesh_client import UnavailableError

        if self.hang:
            await asyncio.Event().wait()
        raise UnavailableError("connection refused")

    async def close_session(self, session_id: str) -> None:
        return None


@pytest.mark.parametrize("hang", [False, True])
async def test_a_replay_the_verifier_cannot_answer_ends_the_run_not_the_row(hang: bool) -> None:
    """Replay (reverify of an environment that takes turns): an unreachable verifier is
    VerifierUnavailable and one that answers nothing within the idle timeout ReverifyTimeout; both
    end the run (they are RollmeshErrors, which a row's own failure is caught as)."""
    from typing import Any
    from typing import cast

    from rollmesh.commands._errors import ReverifyTimeout
    from rollmesh.commands._errors import VerifierUnavailable
    from rollmesh.commands._reverify import ReverifyReport
    from rollmesh.commands._reverify import _replay_all
    from rollmesh.scheduler.records import Rollout
    from rollmesh.scheduler.records import RolloutKey

    row = Rollout(
        RolloutKey(0, 0), "job1", task("hi"), [{"role": "assistant", "content": "hello"}], 1.0
    ).to_row()
    report = ReverifyReport(rows=[row])
    with pytest.raises(ReverifyTimeout if hang else VerifierUnavailable, match="replaying row 0"):
        await _replay_all([row], "env", cast(Any, _Down(hang)), 1, 0.5, report, None)
    assert report.errors == 0 and "reverify_error" not in row
