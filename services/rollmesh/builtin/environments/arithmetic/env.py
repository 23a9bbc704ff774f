r"""`arithmetic`: integer addition ("What is {a} + {b}?"); the final answer is checked.

Contract: the answer is the final value of the last assistant message (outside its think blocks:
mesh/answer_text.py), read as ONE value with a number grammar (number.py): its last number with
everything written around it that belongs to a value: sign (`-`, `- 5`, `-(5)`, Unicode minus
signs and dashes), separators, decimal part, exponent, fraction (`10/2`, `\frac{10}{2}`), power
(`2^{10}`, `2³`), scientific notation (`5\times10^{3}`), mixed number (`2½`). It scores 1.0 only
when that value is exactly the expected integer, so no wrong answer matches through a fragment of
itself (`12.5`, `2^{3}`, `\frac{10}{2}`, `0x10`, `10÷2` never match the digits they end with).
What cannot be read as one value without guessing is refused (0 with a reason, never a value): an
expression (`41 + 19`, `10÷2`), a percentage, a factorial, a root, a base prefix, a comma that is
not a thousands separator, a number glued to a word or struck through.
"""

from __future__ import annotations

from rollmesh.builtin.environments.arithmetic.number import NOT_INTEGER
from rollmesh.builtin.environments.arithmetic.number import WINDOW
from rollmesh.builtin.environments.arithmetic.number import Reading
from rollmesh.builtin.environments.arithmetic.number import final_answer
from rollmesh.builtin.environments.arithmetic.number import plain_digits
from rollmesh.builtin.environments.arithmetic.number import read_final_answer
from rollmesh.mesh.answer_text import outside_think
from rollmesh.verifier import BadTask
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifyResult

__all__ = ["NOT_INTEGER", "Arithmetic", "Reading", "final_answer", "last_integer"]


def last_integer(text: str) -> str | None:
    """The final answer of `text` as an integer string, or None when there is none or it is not an
    integer (scripts/eval_tiny_model.py scores the model card's figures with it)."""
    read = final_answer(text)
    value = None if read is None else read.integer
    return None if value is None else str(value)


class Arithmetic(Environment):
    """Integer addition problems. The answer is the final value of the last assistant message
    (number.py); reward 1.0 when it equals `expected_answer`, else 0.0."""

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        # One pass over the response's last WINDOW characters and a bounded parse: microseconds, so
        # it runs on the loop (an async verify) instead of paying a thread hop per rollout.
        del session
        written = response.final_text
        text = outside_think(written)  # what the model only thought is not its answer
        try:
            expected = int(str(task.expected_answer).strip())
        except ValueError:
            raise BadTask(f"task has no integer expected_answer (got {task.expected_answer!r:.80})") from None
        digits = plain_digits(text)  # the common case, read as the full reading reads it
        if digits is not None:
            value: int | None = int(digits)
            read = None
        else:
            read = read_final_answer(text)
            value = None if read is None else read.integer
        if value is None:
            if read is not None:
                reason = read.reason
            else:
                reason = (
                    "empty response"
                    if not written.strip()
                    else "no answer outside the think block"
                    if not text.strip()
                    else f"no number in the response's last {WINDOW} characters"
                    if len(text) > WINDOW
                    else "no integer in the response"
                )
            extracted = "" if read is None else read.text[:80]
            return VerifyResult(
                0.0, {"correct": 0.0}, extracted, {"reason": reason, "expected": str(expected)}
            )
        ok = value == expected
        return VerifyResult(
            1.0 if ok else 0.0,
            {"correct": 1.0 if ok else 0.0},
            str(value),
            {"expected": str(expected), "reason": "match" if ok else "wrong answer"},
        )
