"""A verifiers SingleTurnEnv with a rubric of three weighted functions: the exact answer (1.0), a
number in the answer (0.5), and brevity (0.25, a fraction: shorter answers score more)."""

from __future__ import annotations

import re

import verifiers as vf
from datasets import Dataset


def exact(completion: vf.Messages, answer: str) -> float:
    text = str(completion[-1].content or "")
    return 1.0 if re.findall(r"-?\d+", text)[-1:] == [answer] else 0.0


def has_number(completion: vf.Messages) -> float:
    return 1.0 if re.search(r"\d", str(completion[-1].content or "")) else 0.0


def brevity(completion: vf.Messages) -> float:
    return 1.0 / (1.0 + len(str(completion[-1].content or "").split()))


def load_environment() -> vf.Environment:
    rows = [
        {"question": f"What is {a} + {b}?", "answer": str(a + b)}
        for a, b in [(2, 3), (10, 5), (7, 8), (1, 30)]
    ]
    rubric = vf.Rubric(funcs=[exact, has_number, brevity], weights=[1.0, 0.5, 0.25])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)
