"""Trainer SDK batching: padding, masks, GRPO advantages by task, verl's prompt/response layout."""

from __future__ import annotations

import numpy as np
import pytest

from rollmesh.scheduler import convert
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.tokens import build_token_record
from rollmesh_client.trainer import TrainerRollout
from rollmesh_client.trainer import collate
from rollmesh_client.trainer import grpo_advantages
from rollmesh_client.trainer import parse_version
from rollmesh_client.trainer import verl_view


def tr(
    t: int, i: int, reward: float, ids: list[int], mask: list[int], prompt_len: int, version: str = "3"
) -> TrainerRollout:
    lps = [-0.5 if m else 0.0 for m in mask]
    turns = [TurnSpan(0, prompt_len, len(ids), version)]
    r = Rollout(
        RolloutKey(t, i),
        "j",
        {},
        [],
        reward,
        tokens=TokenRecord(ids, mask, lps, turns),
        policy_version=version,
    )
    return TrainerRollout.from_pb(convert.rollout_to_pb(r))


def test_collate_pads_and_groups_by_task() -> None:
    rs = [
        tr(0, 0, 1.0, [1, 2, 3, 4], [0, 0, 1, 1], 2),
        tr(0, 1, 0.0, [1, 2, 5], [0, 0, 1], 2),
        tr(7, 0, 1.0, [9, 8, 7, 6, 5, 4], [0, 1, 1, 0, 1, 1], 1),
    ]
    b = collate(rs, pad_id=-1)
    assert b.input_ids.tolist() == [[1, 2, 3, 4, -1, -1], [1, 2, 5, -1, -1, -1], [9, 8, 7, 6, 5, 4]]
    assert b.attention_mask.sum(axis=1).tolist() == [4, 3, 6]
    assert b.loss_mask[2].tolist() == [0, 1, 1, 0, 1, 1]
    assert b.logprobs[0].tolist() == [0, 0, -0.5, -0.5, 0, 0]
    assert b.group_ids.tolist() == [0, 0, 1] and b.prompt_lengths.tolist() == [2, 2, 1]
    assert b.keys == [("j", 0, 0), ("j", 0, 1), ("j", 7, 0)] and b.policy_versions == ["3", "3", "3"]
    # group 0: rewards 1, 0 -> +1, -1 (population std 0.5); a group of one -> 0
    assert b.advantages().tolist() == pytest.approx([1.0, -1.0, 0.0], abs=1e-4)
    assert b.advantages(normalize_std=False).tolist() == pytest.approx([0.5, -0.5, 0.0])
    cut = collate(rs, max_len=4, pad_to_multiple_of=8)
    assert cut.input_ids.shape == (3, 8) and cut.truncated.tolist() == [False, False, True]
    assert cut.lengths.tolist() == [4, 3, 4]


def test_grpo_advantages_hand_values() -> None:
    adv = grpo_advantages([1, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1])
    std = np.std([1, 0, 0, 0])
    assert adv[:4] == pytest.approx([(1 - 0.25) / std, -0.25 / std, -0.25 / std, -0.25 / std], rel=1e-4)
    assert adv[4:].tolist() == [0.0, 0.0]  # identical rewards: no signal


def test_verl_view() -> None:
    rs = [tr(0, 0, 1.0, [1, 2, 3, 4], [0, 0, 1, 1], 2), tr(0, 1, 0.5, [1, 5, 6, 7, 8], [0, 1, 0, 1, 1], 1)]
    v = verl_view(collate(rs), pad_id=0)
    assert v["prompts"].tolist() == [[1, 2], [0, 1]]
    assert v["responses"].tolist() == [[3, 4, 0, 0], [5, 6, 7, 8]]
    assert v["response_mask"].tolist() == [[1, 1, 0, 0], [1, 0, 1, 1]]
    assert v["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]]
    assert v["position_ids"].tolist() == [[0, 1, 2, 3, 3, 3], [0, 0, 1, 2, 3, 4]]
    assert v["token_level_scores"].tolist() == [[0, 1.0, 0, 0], [0, 0, 0, 0.5]]


def test_versions() -> None:
    assert parse_version("12") == 12 and parse_version("") is None and parse_version("v2") is None
    r = tr(0, 0, 1.0, [1, 2], [0, 1], 1, version="5")
    assert r.version == 5 and r.prompt_length == 1


def test_collate_refuses_a_rollout_without_token_ids() -> None:
    # Its reward would shift its group's mean and std while no token of it is trained on.
    rs = [tr(0, 0, 1.0, [1, 2, 3], [0, 1, 1], 1), tr(0, 1, 0.0, [], [], 0)]
    with pytest.raises(ValueError, match="rollout j/0/1 has no token record"):
        collate(rs)


def unrecorded(
    t: int, i: int, reward: float, ids: list[int], mask: list[int], prompt_len: int
) -> TrainerRollout:
    """A rollout of a job that did not ask for logprobs, as the scheduler builds and sends it."""
    rec = build_token_record([Turn({}, ids[:prompt_len], ids[prompt_len:], policy_version="3")])
    assert rec.loss_mask == mask and rec.logprobs == [0.0] * len(ids)  # zeros on the wire, as before
    return TrainerRollout.from_pb(
        convert.rollout_to_pb(Rollout(RolloutKey(t, i), "j", {}, [], reward, tokens=rec))
    )


def test_logprobs_a_job_did_not_record_never_reach_a_trainer_as_values() -> None:
    # They were zeros: a PPO/GRPO ratio exp(new - 0) trained on garbage without a word.
    rs = [
        unrecorded(0, 0, 1.0, [1, 2, 3, 4], [0, 0, 1, 1], 2),
        unrecorded(0, 1, 0.0, [1, 2, 5], [0, 0, 1], 2),
    ]
    assert [r.logprobs for r in rs] == [None, None]
    batch = collate(rs)
    assert batch.logprobs is None and batch.loss_mask[0].tolist() == [0, 0, 1, 1]
    assert "old_log_probs" not in verl_view(batch) and verl_view(batch)["responses"].shape == (2, 2)
    with pytest.raises(
        ValueError, match=r"^rollout j/0/0 has no logprobs: submit its job with sampling\.logprobs=true"
    ):
        collate(rs, require_logprobs=True)
    # One such row makes the whole batch's logprobs None (the array would hold its zeros).
    mixed = [tr(0, 0, 1.0, [1, 2, 3, 4], [0, 0, 1, 1], 2), rs[1]]
    assert collate(mixed).logprobs is None
    with pytest.raises(ValueError, match="rollout j/0/1 has no logprobs"):
        collate(mixed, require_logprobs=True)


def test_recorded_logprobs_are_unchanged_and_pass_require_logprobs() -> None:
    rs = [tr(0, 0, 1.0, [1, 2, 3, 4], [0, 0, 1, 1], 2), tr(0, 1, 0.0, [1, 2, 5], [0, 0, 1], 2)]
    assert rs[0].raw.tokens.logprobs_recorded and rs[0].logprobs == [0, 0, -0.5, -0.5]
    batch = collate(rs, require_logprobs=True)
    assert batch.logprobs is not None and batch.logprobs.tolist() == [[0, 0, -0.5, -0.5], [0, 0, -0.5, 0]]
    assert verl_view(batch)["old_log_probs"].tolist() == [[-0.5, -0.5], [-0.5, 0]]


def test_a_record_from_a_scheduler_before_the_flag_counts_as_recorded_only_with_a_non_zero_logprob() -> None:
    for lps, recorded in (([0.0, 0.0, -0.5, 0.0], True), ([0.0] * 4, False)):
        msg = convert.rollout_to_pb(
            Rollout(RolloutKey(0, 0), "j", {}, [], 1.0, tokens=TokenRecord([1, 2, 3, 4], [0, 0, 1, 1], lps))
        )
        msg.tokens.ClearField("logprobs_recorded")  # what an older scheduler sends
        assert (TrainerRollout.from_pb(msg).logprobs is not None) is recorded
