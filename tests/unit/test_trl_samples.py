"""The TRL adapter's pure parts: a token record split into TRL's prompt / completion / env_mask,
failed and unusable rollouts as unscorable completions, rows found again by prompt, TRL's groups
from the repeated prompts, and the trainer's sampling settings (refused when rollmesh cannot apply
them)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rollmesh.scheduler import convert
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh_client.trainer import TrainerRollout
from rollmesh_client.trl import RollmeshRollouts
from rollmesh_client.trl import failed_sample
from rollmesh_client.trl import row_prompt
from rollmesh_client.trl import trl_sample
from rollmesh_client.trl._rollout_func import _runs
from rollmesh_client.trl._rollout_func import _sampling
from rollmesh_client.trl._rollout_func import push_due
from rollmesh_client.trl._samples import RowIndex
from rollmesh_client.trl._samples import prompt_key


def rollout(
    ids: list[int], mask: list[int], turns: list[TurnSpan], *, masked: bool = False
) -> TrainerRollout:
    lps = [-0.25 * (i + 1) if m else 0.0 for i, m in enumerate(mask)]
    r = Rollout(
        RolloutKey(3, 1), "job-x", {}, [], 1.0, tokens=TokenRecord(ids, mask, lps, turns), policy_version="4"
    )
    r.masked = masked
    return TrainerRollout.from_pb(convert.rollout_to_pb(r))


def test_a_two_turn_record_splits_at_the_first_generated_id() -> None:
    # prompt [1 2 3], turn 1 [4 5], tool result [6 7], turn 2 [8 9]
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    mask = [0, 0, 0, 1, 1, 0, 0, 1, 1]
    s = trl_sample(rollout(ids, mask, [TurnSpan(0, 3, 5, "4"), TurnSpan(5, 7, 9, "4")]))
    assert s.prompt_ids == [1, 2, 3] and s.completion_ids == [4, 5, 6, 7, 8, 9]
    assert s.env_mask == [1, 1, 0, 0, 1, 1]
    assert s.logprobs == pytest.approx([-1.0, -1.25, 0.0, 0.0, -2.0, -2.25])
    assert s.reward == 1.0 and s.policy_version == 4 and s.failure == "" and s.key == "job-x/3/1"


def test_unusable_records_are_failed_samples_not_guesses() -> None:
    masked = trl_sample(rollout([1, 2, 3], [0, 1, 1], [TurnSpan(0, 1, 3, "4")], masked=True))
    assert masked.reward is None and masked.failure.startswith("MASKED")
    assert masked.env_mask == [
        0,
        0,
    ]  # no verdict: no loss (as collate), and TRL gives a None reward no advantage
    empty = trl_sample(rollout([], [], []))
    assert empty.failure.startswith("NO_TOKEN_RECORD") and empty.reward is None
    two_segments = [TurnSpan(0, 2, 3, "4"), TurnSpan(3, 5, 6, "4", segment=1)]
    seg = trl_sample(rollout([1, 2, 3, 1, 2, 3], [0, 0, 1, 0, 0, 1], two_segments))
    assert seg.failure.startswith("SEGMENTED_TOKEN_RECORD") and seg.reward is None
    f = failed_sample([1, 2], 7, "UNAVAILABLE: down", "j/0/0")
    assert (f.completion_ids, f.env_mask, f.logprobs, f.reward) == ([7], [0], [0.0], None)


def test_rows_are_found_again_by_their_prompt() -> None:
    index = RowIndex()
    nemo = {
        "responses_create_params": {"input": [{"role": "user", "content": "What is 1 + 2?"}]},
        "expected_answer": "3",
    }
    trl_row = {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "expected_answer": "4"}
    text = {"responses_create_params": {"input": "Count to 3."}, "expected_answer": "3"}
    prompts = index.add([nemo, trl_row, text])
    assert prompts[2] == [{"role": "user", "content": "Count to 3."}]
    # what a datasets column hands back: every message with the union of keys, None where absent
    back = [{"role": "user", "content": "What is 2 + 2?", "tool_calls": None}]
    assert index.row(back)["expected_answer"] == "4"
    assert index.row(back)["responses_create_params"]["input"] == [
        {"role": "user", "content": "What is 2 + 2?"}
    ]
    assert index.row(prompts[0]) == nemo
    index.add([nemo])  # the same row twice is the same row
    with pytest.raises(ValueError, match="same prompt"):
        index.add([{**nemo, "expected_answer": "4"}])
    with pytest.raises(KeyError, match="not a row"):
        index.row([{"role": "user", "content": "never registered"}])
    instructions = {"responses_create_params": {"input": "hi", "instructions": "be brief"}}
    assert row_prompt(instructions) == [{"role": "user", "content": "hi"}]  # a string input is the user turn
    items = {
        "responses_create_params": {
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                }
            ]
        }
    }
    assert row_prompt(items) == [{"role": "user", "content": "ab"}]


def test_groups_are_runs_of_the_same_prompt() -> None:
    a, b = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    assert _runs([a, a, a, b, b, b]) == [(0, 3), (3, 3)]
    assert _runs([a, b, b, a]) == [(0, 1), (1, 2), (3, 1)]  # a slice that cut a group
    assert prompt_key("x") == prompt_key([{"role": "user", "content": "x"}])


def test_sampling_follows_the_trainer_and_refuses_what_it_cannot_apply() -> None:
    args = SimpleNamespace(
        temperature=0.7,
        top_p=0.9,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        generation_kwargs=None,
        max_completion_length=16,
    )
    s = _sampling(args)
    assert s.temperature == pytest.approx(0.7) and s.top_p == pytest.approx(0.9) and s.max_tokens == 16
    assert not s.HasField("top_k") and s.logprobs
    for bad in ({"min_p": 0.1}, {"repetition_penalty": 1.1}, {"generation_kwargs": {"stop": ["x"]}}):
        with pytest.raises(ValueError, match="cannot apply"):
            _sampling(SimpleNamespace(**{**vars(args), **bad}))


def test_weights_are_pushed_every_sync_every_steps() -> None:
    pushed, last = [], None
    for step in [0, 0, 1, 2, 2, 3, 4, 5, 6]:  # repeated steps: an evaluation, or several generations a step
        if push_due(last, step, 2, initial=True):
            pushed.append(step)
            last = step
    assert pushed == [0, 2, 4, 6]
    assert [s for s in range(5) if push_due(None, s, 3, initial=False)] == [3, 4]  # first push at step 3


def test_a_peft_model_is_refused_before_anything_is_saved(tmp_path: Path) -> None:
    rollouts = RollmeshRollouts(
        environment="arithmetic", gateway="127.0.0.1:1", scheduler="127.0.0.1:1", work_dir=tmp_path
    )
    accelerator = SimpleNamespace(
        is_main_process=True, unwrap_model=lambda m: m, wait_for_everyone=lambda: None
    )
    trainer = SimpleNamespace(
        state=SimpleNamespace(global_step=0),
        accelerator=accelerator,
        model=SimpleNamespace(peft_config={"default": object()}),
        processing_class=None,
    )
    try:
        with pytest.raises(ValueError, match="PEFT"):
            rollouts.sync_weights(trainer)
        assert not (tmp_path / "checkpoints").exists() and rollouts.weights.pushes == []
    finally:
        rollouts.close()
