"""A verifiers SingleTurnEnv whose rubric has a group reward function (its reward depends on the
other rollouts of the task: `score_group`), which a per-rollout verify must refuse, not score."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def longest_wins(completions: list[vf.Messages]) -> list[float]:
    sizes = [len(str(c[-1].content or "")) for c in completions]
    return [1.0 if s == max(sizes) else 0.0 for s in sizes]


def load_environment() -> vf.Environment:
    rows = [{"question": "What is 2 + 2?", "answer": "4"}]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[longest_wins]))
