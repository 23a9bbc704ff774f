"""A verifiers SingleTurnEnv whose scoring fails on some rows, each way verifiers 0.3 counts 0
without a verdict: a reward function that raises (for "What is 10 + 5?"), and, with `math=True`,
a MathRubric whose math-verify takes longer than its `timeout_seconds` (every row). The bridge must
fail those verifies by name (REWARD_FUNCTION_FAILED), never store a reward of 0."""

from __future__ import annotations

import re

import verifiers as vf
from datasets import Dataset


def exact(completion: vf.Messages, answer: str) -> float:
    if answer == "15":
        raise RuntimeError("the grader's lookup table has no entry for 15")
    text = str(completion[-1].content or "")
    return 1.0 if re.findall(r"-?\d+", text)[-1:] == [answer] else 0.0


def load_environment(math: bool = False) -> vf.Environment:
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 3), (10, 5)]]
    if math:
        # any math-verify run takes longer than this: verifiers counts it 0 (a debug record)
        rubric: vf.Rubric = vf.MathRubric(parser=vf.Parser(), timeout_seconds=1e-9)
    else:
        rubric = vf.Rubric(funcs=[exact], weights=[1.0])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)
