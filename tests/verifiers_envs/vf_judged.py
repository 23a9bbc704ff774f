"""A verifiers (0.3) SingleTurnEnv scored by a JudgeRubric: the judge model says whether the reply
matches the answer (1.0 for "yes"). The environment builds its judge with verifiers' defaults (an
`AsyncOpenAI()` client, `gpt-4.1-nano`): rollmesh points it at the gateway's OpenAI facade."""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


async def judged(judge: Any, prompt: vf.Messages, completion: vf.Messages, answer: str, state: Any) -> float:
    verdict = await judge(prompt, completion, answer, state)
    return 1.0 if verdict.strip().lower().startswith("yes") else 0.0


def load_environment() -> vf.Environment:
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in [(2, 2), (7, 5), (3, 4)]]
    rubric = vf.JudgeRubric()
    rubric.add_reward_func(judged)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), rubric=rubric)
