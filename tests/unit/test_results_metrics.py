"""Metrics against hand-computed values: pass@k (unbiased, n > k), maj@k ties, reward stats."""

from __future__ import annotations

import math

import pytest

from rollmesh.scheduler import convert
from rollmesh.scheduler.metrics import Metrics
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.metrics import default_k_values
from rollmesh.scheduler.metrics import group_of
from rollmesh.scheduler.metrics import group_profile
from rollmesh.scheduler.metrics import majority_correct
from rollmesh.scheduler.metrics import pass_at_k
from rollmesh.scheduler.metrics import task_profile
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey


def ro(
    t: int, i: int, reward: float, answer: str = "", *, completion: int = 10, task_id: str = ""
) -> Rollout:
    task = {"task_id": task_id} if task_id else {"q": t}
    return Rollout(
        key=RolloutKey(t, i),
        job_id="j",
        task=task,
        messages=[],
        reward=reward,
        extracted_answer=answer,
        prompt_tokens=5,
        completion_tokens=completion,
    )


def test_pass_at_k_single_task_hand_values() -> None:
    # 1 - C(n-c, k) / C(n, k)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - math.comb(7, 4) / math.comb(10, 4))
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k: every draw of 2 holds a correct one
    assert pass_at_k(8, 2, 1) == pytest.approx(2 / 8)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_default_k_values() -> None:
    assert default_k_values(1) == [1]
    assert default_k_values(4) == [1, 2, 4]
    assert default_k_values(6) == [1, 2, 4, 6]
    assert default_k_values(0) == []


def test_compute_two_tasks_hand_values() -> None:
    rollouts = [ro(0, i, r) for i, r in enumerate([1, 0, 0, 0])] + [
        ro(1, i, r) for i, r in enumerate([1, 1, 0, 0])
    ]
    m = compute(reversed(rollouts))  # arrival order must not matter
    assert m.k_values == [1, 2, 4]
    assert m.pass_at_k[1] == pytest.approx((0.25 + 0.5) / 2)
    assert m.pass_at_k[2] == pytest.approx((0.5 + (1 - 1 / 6)) / 2)
    assert m.pass_at_k[4] == pytest.approx(1.0)
    assert m.pass_at_1_avg == pytest.approx(0.375)
    # first 2 rollouts: task0 [1,0] -> 0.5, task1 [1,1] -> 1.0
    assert m.pass_at_1_avg_of_k[2] == pytest.approx(0.75)
    # rewards [1,0,0,0,1,1,0,0]: mean 3/8, sample variance 1.875/7
    assert m.mean_reward == pytest.approx(0.375)
    assert m.std_reward == pytest.approx(math.sqrt(1.875 / 7))
    assert m.stderr_reward == pytest.approx(math.sqrt(1.875 / 7) / math.sqrt(8))
    assert (m.num_rollouts, m.num_tasks, m.num_failures) == (8, 2, 0)
    assert m.mean_prompt_tokens == 5 and m.mean_completion_tokens == 10 and m.total_completion_tokens == 80


def test_maj_at_k_ties_go_to_the_answer_seen_first() -> None:
    # task 0: "7" is right; votes 7,5,5,7 -> 2-2 tie, "7" appeared first -> correct
    t0 = [ro(0, 0, 1.0, "7"), ro(0, 1, 0.0, "5"), ro(0, 2, 0.0, "5"), ro(0, 3, 1.0, "7")]
    # task 1: "7" is right; votes 5,7,7,5 -> tie, "5" appeared first -> wrong
    t1 = [ro(1, 0, 0.0, "5"), ro(1, 1, 1.0, "7"), ro(1, 2, 1.0, "7"), ro(1, 3, 0.0, "5")]
    assert majority_correct(t0) == 1.0
    assert majority_correct(t1) == 0.0
    m = compute(t1 + t0)
    assert m.maj_at_k[4] == pytest.approx(0.5)
    assert m.maj_at_k[2] == pytest.approx(0.5)  # [7,5] -> 7 right; [5,7] -> 5 wrong
    assert m.maj_at_k[1] == pytest.approx(0.5)
    # a clear majority beats order; empty answers abstain
    t2 = [ro(2, 0, 0.0, ""), ro(2, 1, 0.0, "3"), ro(2, 2, 1.0, "4"), ro(2, 3, 1.0, "4")]
    assert majority_correct(t2) == 1.0
    assert majority_correct([ro(3, 0, 1.0, ""), ro(3, 1, 1.0, "")]) == 0.0


def test_tasks_with_fewer_rollouts_than_k_are_left_out_and_failures_counted() -> None:
    rollouts = [ro(0, i, 1.0) for i in range(4)] + [ro(1, 0, 0.0), ro(1, 1, 0.0)]
    failures = [
        RolloutFailure(RolloutKey(1, 2), "j", "UNAVAILABLE", "down", 3),
        RolloutFailure(RolloutKey(1, 3), "j", "UNAVAILABLE", "down", 3),
        RolloutFailure(RolloutKey(0, 0), "j", "UNAVAILABLE", "retried on resume", 3),  # has a rollout
    ]
    m = compute(rollouts, failures, num_repeats=4)
    assert m.num_tasks_at_k == {1: 2, 2: 2, 4: 1}
    assert m.pass_at_k[4] == 1.0  # only task 0 has 4 rollouts
    assert m.pass_at_k[2] == pytest.approx(0.5)
    assert m.num_failures == 2 and m.failures_by_class == {"UNAVAILABLE": 2}


def test_duplicates_count_once_and_profile() -> None:
    rollouts = [ro(3, 0, 0.5, task_id="t3"), ro(3, 1, 1.0, task_id="t3"), ro(3, 0, 0.0, task_id="t3")]
    m = compute(rollouts, k_values=[1])
    assert m.num_rollouts == 2 and m.num_duplicates == 1
    (p,) = m.tasks
    assert (p.task_index, p.task_id, p.num_rollouts, p.num_correct) == (3, "t3", 2, 1)
    assert (p.mean_reward, p.min_reward, p.max_reward) == (0.75, 0.5, 1.0)
    assert p.std_reward == pytest.approx(math.sqrt(0.125))
    assert task_profile(rollouts) == m.tasks


def test_json_round_trip_and_proto() -> None:
    rollouts = [ro(t, i, float((t + i) % 2), str(i % 2)) for t in range(3) for i in range(4)]
    data = compute(rollouts, threshold=0.5).to_json()
    assert set(data["pass_at_k"]) == {"1", "2", "4"}
    back = Metrics.from_json(data)
    assert back.to_json() == data
    pb = convert.metrics_to_pb(data)
    assert dict(pb.pass_at_k) == pytest.approx(back.pass_at_k)
    assert pb.num_rollouts == 12 and len(pb.tasks) == 3
    assert dict(pb.maj_at_k) == pytest.approx(back.maj_at_k)


def test_empty_run() -> None:
    m = compute([])
    assert m.num_rollouts == 0 and m.pass_at_k == {} and m.k_values == []


def test_scored_records_give_the_same_metrics_as_whole_rollouts() -> None:
    """The scheduler keeps `Scored` records (not rollouts) for a sink it cannot read back; the
    metrics must not change, token-record lengths included."""
    from rollmesh.scheduler.metrics import Scored
    from rollmesh.scheduler.records import TokenRecord

    whole = []
    for t in range(3):
        for i in range(4):
            r = ro(t, i, float((t + i) % 2), str((t * i) % 3), completion=3 + i, task_id=f"q{t}" if t else "")
            r.tokens = TokenRecord(
                token_ids=list(range(7 + t)), loss_mask=[0] * (7 + t), logprobs=[0.0] * (7 + t)
            )
            whole.append(r)
    failures = [RolloutFailure(RolloutKey(5, 0), "j", "UNAVAILABLE", "gone", 3)]
    expected = compute(whole, failures, k_values=[1, 2, 4]).to_json()
    assert expected["mean_record_tokens"] == pytest.approx(8.0)
    assert compute([Scored.of(r) for r in whole], failures, k_values=[1, 2, 4]).to_json() == expected
    assert [p.task_id for p in task_profile([Scored.of(r) for r in whole])] == ["0", "q1", "q2"]


def test_group_profile_gives_each_generator_its_own_pass_at_k() -> None:
    """reasoning-gym rows are GENERATOR/INDEX: a mixture's metrics per generator, by hand."""
    rollouts = [
        ro(0, 0, 1.0, task_id="chain_sum/0"),
        ro(0, 1, 0.0, task_id="chain_sum/0"),
        ro(1, 0, 0.12, task_id="chain_sum/1"),
        ro(1, 1, 0.12, task_id="chain_sum/1"),
        ro(2, 0, 1.0, task_id="gcd/2"),
        ro(2, 1, 1.0, task_id="gcd/2"),
        ro(2, 1, 0.0, task_id="gcd/2"),  # a duplicate key counts once
        ro(3, 0, 0.0, task_id="plain"),
    ]
    groups = {g.group: g for g in group_profile(rollouts)}
    assert sorted(groups) == ["chain_sum", "gcd", "plain"]
    chain = groups["chain_sum"]
    assert (chain.num_tasks, chain.num_rollouts, chain.num_correct) == (2, 4, 1)
    assert chain.pass_at_k == {1: 0.25, 2: 0.5} and chain.pass_at_1_avg == 0.25
    assert math.isclose(chain.mean_reward, (1.0 + 0.0 + 0.12 + 0.12) / 4)
    assert groups["gcd"].pass_at_k == {1: 1.0, 2: 1.0} and groups["gcd"].num_rollouts == 2
    assert groups["plain"].to_json()["pass_at_k"] == {"1": 0.0}
    assert (group_of("a/b/7"), group_of("solo")) == ("a/b", "solo")


def test_a_packed_summary_unpacks_to_the_same_and_holds_no_object_the_collector_scans() -> None:
    """The JSONL sink holds one packed Scored per row it wrote for the job's whole run."""
    import gc

    from rollmesh.scheduler.metrics import Scored
    from rollmesh.scheduler.records import TokenRecord
    from rollmesh.scheduler.records import TurnSpan
    from rollmesh.scheduler.timing import RolloutTiming

    r = Rollout(
        RolloutKey(3, 1),
        "job1",
        {"id": "t3"},
        [{"role": "assistant", "content": ""}],
        0.5,
        extracted_answer="4",
        tokens=TokenRecord([1, 2], [0, 1], [0.0, -0.5], [TurnSpan(0, 1, 2, "0", "r0")]),
        finish_reason="length",
        masked=True,
        timing=RolloutTiming(0.1, 0.0, 0.2, [0.3], [0.05], [], [0.4], 0.6),
    )
    scored = Scored.stored(r)
    assert scored.health  # an empty turn cut at max tokens: findings to carry
    packed = scored.pack()
    assert Scored.unpack(Scored.stored_packed(r)) == scored  # what the JSONL sink keeps, built at once
    # ... and built from the row's already rounded timing: the same summary, non-finite phases too
    for timing in (
        r.timing,
        RolloutTiming(1 / 3, float("inf"), 2e-7, [1 / 7, 5e-7], [], [], [], float("nan")),
    ):
        assert timing is not None
        r.timing = timing
        assert Scored.unpack(Scored.stored_packed(r, timing.to_json())) == Scored.stored(r)
    assert not gc.is_tracked(packed)  # never in the collector's sight (no collection needed first)
    assert Scored.unpack(packed) == scored
