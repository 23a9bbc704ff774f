"""scheduler/row_text.py: a rollout's row text is, character for character, what json writes for
`to_row()` (the sink's encoder, and json.dumps with the same arguments), for rollouts of every shape
the fast path takes and every kind it leaves to `to_row`; a value json cannot write fails the same."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import Any

import pytest

from rollmesh.mesh.versions import VersionSpan
from rollmesh.scheduler.records import ADDED_FIELDS
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.row_text import ENCODE
from rollmesh.scheduler.row_text import row_text
from rollmesh.scheduler.timing import RolloutTiming


class _Level(enum.IntEnum):
    HIGH = 3


class _Text(str):
    pass


def _base() -> Rollout:
    """A rollout as the bench's arithmetic job writes it (one model turn, a verdict, its timing)."""
    return Rollout(
        key=RolloutKey(7, 3),
        job_id="job-3501ff07f74c",
        task={
            "responses_create_params": {"input": [{"role": "user", "content": "What is 81 + 58?"}]},
            "expected_answer": "139",
            "task_id": "arith-0007",
        },
        messages=[{"role": "assistant", "content": "139"}],
        reward=1.0,
        reward_components={"correct": 1.0},
        extracted_answer="139",
        verify_details={"expected": "139", "reason": "match"},
        tokens=TokenRecord(
            list(range(60, 85)),
            [0] * 22 + [1] * 3,
            [0.0] * 22 + [-0.25, -1e-05, -3.5e-7],
            [TurnSpan(0, 22, 25, "v0", "fake-0")],
        ),
        prompt_tokens=22,
        completion_tokens=3,
        latency_s=0.065911,
        policy_version="v0",
        seed=12,
        finish_reason="stop",
        timing=RolloutTiming(queued_s=9.1e-06, model_s=[0.041605496], verify_s=0.024086653997),
    )


def _tool_episode() -> dict[str, Any]:
    return {
        "messages": [
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "let me look",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"x": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "look", "content": 'ünï ☃ \u2028 \x00 " \\'},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
            {"role": "user", "content": "env says"},
        ],
        "finish_reason": "tool_calls",
    }


# Each: the fields changed from _base (a callable: the rollout changed in place).
VARIANTS: list[dict[str, Any]] = [
    {},
    {"task": {}},
    {"task": {"q": "ünï ☃ 🚀", "n": [1, 2.5, None, True, {"deep": [[]]}], 1: "int key", 2.5: "f", None: 0}},
    {"task": {"reward": 5, "expected_answer": "x"}},  # a task field of the row's own: to_row's order
    {"task": {"timing": "the task's", "response": {"a": 1}}},
    {"model": "Qwen/Qwen3-0.6B", "job_id": 'j "quoted" ☃', "policy_version": "", "extracted_answer": ""},
    {"finish_reason": "length"},
    {"finish_reason": "weird"},
    {"finish_reason": ""},
    _tool_episode(),
    {"masked": True, "reward": 0.0, "reward_components": {}, "verify_details": {}},
    {"reward": -0.0, "latency_s": 1e16},
    {"reward": 1e-05, "latency_s": 0.0},
    {"reward": math.nan},
    {"reward": math.inf},
    {"latency_s": -math.inf},
    {"reward": 1},  # an int reward: to_row writes 1, not 1.0
    {"reward": True},
    {"prompt_tokens": True, "completion_tokens": 0},
    {"attempts": _Level.HIGH, "seed": 10**30},
    {"seed": -5},
    {"job_id": _Text("a str subclass")},
    {"timing": None},
    {
        "timing": RolloutTiming(
            retried_s=0.5, seed_s=0.25, first_token_s=[0.1], tool_s=[0.2, 0.3], env_step_s=[1.0]
        )
    },
    {
        "env_steps": [
            {"reward": 0.5, "done": False, "info": {}},
            {"reward": 1.0, "done": True, "info": {"k": 1}},
        ]
    },
    {"agent_program": {"exit_code": 0, "seconds": 1.5, "calls": 2}},
    {"tokens": TokenRecord()},
    {
        "tokens": TokenRecord(
            [1, 2, 3, 4],
            [0, 1, 1, 1],
            [0.0, -0.5, -0.5, -0.5],
            [TurnSpan(0, 1, 4, "v1", "r", 0, (VersionSpan(1, 2, "v1"), VersionSpan(2, 4, "v2")))],
            logprobs_recorded=True,
        )
    },
    {"messages": []},
]


def _variant(changes: dict[str, Any]) -> Rollout:
    return dataclasses.replace(_base(), **changes)


@pytest.mark.parametrize("changes", VARIANTS, ids=range(len(VARIANTS)))
def test_the_text_json_writes_for_the_row(changes: dict[str, Any]) -> None:
    r = _variant(changes)
    timing = r.timing.to_json() if r.timing is not None else None
    text = row_text(r, timing)
    assert text == ENCODE(r.to_row())
    assert text == json.dumps(r.to_row(), ensure_ascii=False, separators=(",", ":"))
    assert json.loads(text) == json.loads(json.dumps(r.to_row()))


def test_a_timing_not_the_rollouts_is_not_written() -> None:
    """`timing` is `r.timing.to_json()`: given None for a rollout with a timing (or the other way
    round) the row is still to_row's, timing and all."""
    r = _base()
    assert row_text(r, None) == ENCODE(r.to_row())
    untimed = dataclasses.replace(r, timing=None)
    assert row_text(untimed, {"queued_s": 1.0}) == ENCODE(untimed.to_row())


def test_every_field_a_row_adds_to_its_task_is_written_by_to_rows_order() -> None:
    """A task holding any one of the fields the row adds takes to_row (that field keeps its place)."""
    for name in ADDED_FIELDS:
        r = _variant({"task": {"a": 1, name: "the task's"}})
        assert row_text(r, r.timing.to_json() if r.timing else None) == ENCODE(r.to_row())


@pytest.mark.parametrize("where", ["task", "messages", "verify_details", "agent_program", "env_steps"])
def test_a_value_json_cannot_write_fails_as_json_fails(where: str) -> None:
    bad = {1, 2}
    changes: dict[str, Any] = {
        "task": {"a": bad},
        "messages": [{"role": "assistant", "content": "x", "extra": bad}],
        "verify_details": {"x": bad},
        "agent_program": {"x": bad},
        "env_steps": [{"x": bad}],
    }
    r = _variant({where: changes[where]})
    with pytest.raises(TypeError) as expected:
        ENCODE(r.to_row())
    with pytest.raises(TypeError) as got:
        row_text(r, r.timing.to_json() if r.timing else None)
    assert str(got.value) == str(expected.value)


# The variants above that are what rows usually hold: written without building the row.
FAST = [0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 12, 20, 22, 23, 24, 25, 26, 27, 28]


@pytest.mark.parametrize("index", FAST)
def test_usual_rows_are_written_without_to_row(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    r = _variant(VARIANTS[index])
    expected = ENCODE(r.to_row())

    def no_row(self: Rollout) -> dict[str, Any]:
        raise AssertionError("to_row called")

    monkeypatch.setattr(Rollout, "to_row", no_row)
    assert row_text(r, r.timing.to_json() if r.timing is not None else None) == expected
