"""`arithmetic`: integer addition ("What is {a} + {b}?"); the last integer of the answer is checked."""

from __future__ import annotations

import re

from rollmesh.verifier import BadTask, Environment, Response, Session, Task, VerifyResult

_INT = re.compile(r"[-+]?\d+")


def last_integer(text: str) -> str | None:
    """The last integer in `text` (sign kept, '+' dropped), or None."""
    found = _INT.findall(text)
    if not found:
        return None
    return str(int(found[-1]))


class Arithmetic(Environment):
    """Integer addition problems. The answer is the LAST integer in the last assistant message;
    reward 1.0 when it equals `expected_answer`, else 0.0."""

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        # A regex over one bounded response: microseconds, so it runs on the loop (an async verify)
        # instead of paying a thread hop per rollout.
        del session
        text = response.final_text
        extracted = last_integer(text)
        try:
            expected = int(str(task.expected_answer).strip())
        except ValueError:
            raise BadTask(f"task has no integer expected_answer (got {task.expected_answer!r:.80})") from None
        if extracted is None:
            reason = "empty response" if not text.strip() else "no integer in the response"
            return VerifyResult(0.0, {"correct": 0.0}, "", {"reason": reason, "expected": str(expected)})
        ok = int(extracted) == expected
        return VerifyResult(
            1.0 if ok else 0.0,
            {"correct": 1.0 if ok else 0.0},
            extracted,
            {"expected": str(expected), "reason": "match" if ok else "wrong answer"},
        )
