"""A verifiers ToolEnv with two tools: compute (A + B) * C with `add` and `multiply`; the rubric pays
1.0 for the right number in the last answer and 0.25 per tool the model used (weighted)."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def correct(completion: vf.Messages, answer: str) -> float:
    last = next((m for m in reversed(completion) if m.role == "assistant"), None)
    text = str(last.content or "") if last is not None else ""
    return 1.0 if answer in text.split() or f"{answer}." in text.split() else 0.0


def used_both(completion: vf.Messages) -> float:
    names = {c.name for m in completion if m.role == "assistant" for c in (m.tool_calls or [])}
    return len(names & {"add", "multiply"}) / 2


def load_environment(num_rows: int = 4) -> vf.Environment:
    rows = [
        {"question": f"Compute ({a} + {b}) * {c}.", "answer": str((a + b) * c)}
        for a, b, c in [(2, 3, 4), (5, 7, 2), (1, 1, 9), (6, 0, 3), (4, 4, 4)][:num_rows]
    ]
    rubric = vf.Rubric(funcs=[correct, used_both], weights=[1.0, 0.5])
    return vf.ToolEnv(
        dataset=Dataset.from_list(rows),
        tools=[add, multiply],
        rubric=rubric,
        system_prompt="Use the tools, then give the number.",
        max_turns=6,
    )
