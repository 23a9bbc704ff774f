"""A verifiers SingleTurnEnv whose rubric has a group reward function (its reward depends on the other
rollouts of the task: `score_group`) beside an individual one: the scheduler verifies each task's
rollouts together, through verifiers' own `rubric.score_group`."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def longest_wins(completions: list[vf.Messages]) -> list[float]:
    sizes = [len(str(c[-1].content or "")) for c in completions]
    return [1.0 if s == max(sizes) else 0.0 for s in sizes]


def says_the_number(completion: vf.Messages, answer: str) -> float:
    return 1.0 if str(completion[-1].content or "").startswith(answer) else 0.0


def load_environment() -> vf.Environment:
    rows = [{"question": f"Describe the number {n}.", "answer": str(n)} for n in (3, 5, 8)]
    rubric = vf.Rubric(funcs=[longest_wins, says_the_number], weights=[1.0, 0.5])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)
