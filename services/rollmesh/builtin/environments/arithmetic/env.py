"""`arithmetic`: integer addition ("What is {a} + {b}?"); the last number of the answer is checked.

Contract: the answer is the last *number* written in the last assistant message, read whole: with
its decimal part, exponent, thousands separators, a `/` denominator or a power after it. It scores
1.0 only when that number's exact value is the expected integer, so no wrong answer matches by a
fragment of itself (`12.5`, `5e3`, `1/5`, `10^5`, `5²` never match 5; `5,000` never matches 0).
`5.0` and `10/2` are 5, `1,2,3` is its last item; a Unicode minus (U+2212, U+FE63, U+FF0D) is
a minus. An exponent or power the check cannot evaluate cheaply is not an integer.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation, localcontext

from rollmesh.verifier import BadTask, Environment, Response, Session, Task, VerifyResult

# Possessive quantifiers only: one pass over the text, whatever it holds (a nested, backtracking
# pattern took minutes on '1,000,000,...' and this check runs on the event loop).
_MAG = r"\d++(?:[,.]\d++)*+(?:[eE][-+]?\d++)?+"
_NUMBER = re.compile(
    rf"(?:(?<![\w)])(?P<sign>[-+\u2212\ufe63\uff0d\uff0b]))?(?<![\d.])(?P<num>{_MAG})"
    rf"(?:\s*+/\s*+(?P<den>{_MAG}))?+(?P<power>\s*+(?:\^|\*\*)\s*+[-+(]?\d|[⁰¹²³⁴⁵⁶⁷⁸⁹⁻])?"
)
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})++(?:\.\d++)?+(?:[eE][-+]?\d++)?+")
_INT_LIST = re.compile(r"\d++(?:,\d++)++")
_MAX_DIGITS = 4000  # |value| below 10**_MAX_DIGITS is evaluated; anything larger is not an answer


def last_number(text: str) -> tuple[str, int | None] | None:
    """The last number in `text`: (its text, its value when that is an integer, else None); None
    when there is no number."""
    found = None
    for match in _NUMBER.finditer(text):
        found = match
    if found is None:
        return None
    return found.group(0).strip(), None if found.group("power") else _integer_value(found)


def last_integer(text: str) -> str | None:
    """The last number in `text` as an integer string (sign kept, '+' dropped), or None when there
    is no number or the last one is not an integer."""
    last = last_number(text)
    return None if last is None or last[1] is None else str(last[1])


def _integer_value(match: re.Match[str]) -> int | None:
    with localcontext() as ctx:
        ctx.prec = _MAX_DIGITS + 10
        try:
            value, listed = _decimal(match.group("num"))
            if match.group("den") is not None:
                den = _decimal(match.group("den"))[0]
                if den == 0 or value % den != 0:
                    return None
                value = value / den
            if value != value.to_integral_value():
                return None
        except InvalidOperation:  # not a number (`1.2.3`), or too many digits to be exact
            return None
    negative = not listed and match.group("sign") not in (None, "+", "\uff0b")
    return -int(value) if negative else int(value)


def _decimal(text: str) -> tuple[Decimal, bool]:
    """The value of one number's text, and whether it was a comma-separated list of integers
    (`1,2,3`: its last item; `5,000` is five thousand; `1.234,5` is no number)."""
    listed = "," in text and not _THOUSANDS.fullmatch(text)
    if listed and not _INT_LIST.fullmatch(text):
        raise InvalidOperation
    value = Decimal(text.rsplit(",", 1)[1] if listed else text.replace(",", ""))
    if value.adjusted() >= _MAX_DIGITS:
        raise InvalidOperation
    return value, listed


class Arithmetic(Environment):
    """Integer addition problems. The answer is the LAST number in the last assistant message;
    reward 1.0 when its value equals `expected_answer`, else 0.0."""

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        # A regex over one bounded response: microseconds, so it runs on the loop (an async verify)
        # instead of paying a thread hop per rollout.
        del session
        text = response.final_text
        try:
            expected = int(str(task.expected_answer).strip())
        except ValueError:
            raise BadTask(f"task has no integer expected_answer (got {task.expected_answer!r:.80})") from None
        last = last_number(text)
        if last is None or last[1] is None:
            if last is not None:
                reason = "the last number is not an integer"
            else:
                reason = "empty response" if not text.strip() else "no integer in the response"
            extracted = "" if last is None else last[0][:80]
            return VerifyResult(
                0.0, {"correct": 0.0}, extracted, {"reason": reason, "expected": str(expected)}
            )
        ok = last[1] == expected
        return VerifyResult(
            1.0 if ok else 0.0,
            {"correct": 1.0 if ok else 0.0},
            str(last[1]),
            {"expected": str(expected), "reason": "match" if ok else "wrong answer"},
        )
