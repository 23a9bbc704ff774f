r"""`arithmetic`: integer addition ("What is {a} + {b}?"); the last number of the answer is checked.

Contract: the answer is the last *number* written in the last assistant message, read whole: with
its decimal part, exponent, thousands separators, a `/` denominator or a power after it. It scores
1.0 only when that number's exact value is the expected integer, so no wrong answer matches by a
fragment of itself (`12.5`, `5e3`, `1/5`, `10^5`, `5²` never match 5; `5,000` never matches 0).
`5.0` and `10/2` are 5; `5,000`, `5 000`, `5\,000` and `5{,}000` are 5000 (groups of three, one
separator throughout); a Unicode minus (U+2212, U+FE63, U+FF0D) is a minus. What cannot be read
without guessing is refused (0 with a reason, never a value): a comma that is not a thousands
separator (`1,5`: a decimal comma, or a list?), a factorial (`5!`), a root (`√25`, `\sqrt{25}`),
a power in words (`5 squared`).
An exponent or power the check cannot evaluate cheaply is not an integer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext

from rollmesh.verifier import BadTask, Environment, Response, Session, Task, VerifyResult

# Thousands separators: a comma (`{,}` in LaTeX) or a space (a plain, no-break, thin or narrow
# no-break space; LaTeX `\,` or `\ `). Possessive quantifiers only: one pass over the text,
# whatever it holds (a nested, backtracking pattern took minutes on '1,000,000,...' and this check
# runs on the event loop).
_SPACE = r"[ \u00a0\u2009\u202f]|\\[, ]"
_SEP = rf"[,.]|\{{,\}}|{_SPACE}"
_MAG = rf"\d++(?:(?:{_SEP})\d++)*+(?:[eE][-+]?\d++)?+"
_NUMBER = re.compile(
    rf"(?:(?<![\w)])(?P<sign>[-+\u2212\ufe63\uff0d\uff0b]))?(?<![\d.])(?P<num>{_MAG})"
    rf"(?:\s*+/\s*+(?P<den>{_MAG}))?+(?P<power>\s*+(?:\^|\*\*)\s*+[-+(]?\d|[⁰¹²³⁴⁵⁶⁷⁸⁹⁻])?"
    r"(?P<factorial>!(?!=))?"
)
_SPACES = re.compile(_SPACE)
_GROUPED = re.compile(r"\d{1,3}+(?:,\d{3}+)++(?![\d,])(?:\.\d++)?+(?:[eE][-+]?\d++)?+")
_ROOT_BEFORE = re.compile(r"(?:[√∛∜]|\\sqrt(?:\[[^\]]{0,8}\])?|sqrt|cbrt|(?i:root\s++of))\s*+[{(\[]?\s*+$")
_POWER_AFTER = re.compile(r"\s*+(?i:squared|cubed)\b")
_MAX_DIGITS = 4000  # |value| below 10**_MAX_DIGITS is evaluated; anything larger is not an answer
NOT_INTEGER = "the last number is not an integer"


class _Refused(ValueError):
    """A number that cannot be read without guessing; the message is the reason."""


@dataclass(frozen=True)
class Reading:
    """The last number of a text: as written, its value when that is an integer (else None), and
    why it has none ("" when it has one)."""

    text: str
    value: int | None
    reason: str = ""


def last_number(text: str) -> Reading | None:
    """The last number in `text`, read (None when there is no number)."""
    found = None
    for match in _NUMBER.finditer(text):
        found = match
    if found is None:
        return None
    written = found.group(0).strip()
    if found.group("factorial"):
        return Reading(written, None, "the last number is a factorial (`5!`): not read as a number")
    if _ROOT_BEFORE.search(text, max(0, found.start() - 24), found.start()):
        return Reading(written, None, "the last number is under a root (`√25`): not read as a number")
    if _POWER_AFTER.match(text, found.end()):
        return Reading(
            written, None, "the last number is raised to a power (`5 squared`): not read as a number"
        )
    if found.group("power"):
        return Reading(written, None, NOT_INTEGER)
    try:
        value = _integer_value(found)
    except _Refused as exc:
        return Reading(written, None, str(exc))
    return Reading(written, value, "" if value is not None else NOT_INTEGER)


def last_integer(text: str) -> str | None:
    """The last number in `text` as an integer string (sign kept, '+' dropped), or None when there
    is no number or the last one is not an integer."""
    last = last_number(text)
    return None if last is None or last.value is None else str(last.value)


def _integer_value(match: re.Match[str]) -> int | None:
    with localcontext() as ctx:
        ctx.prec = _MAX_DIGITS + 10
        try:
            value, separate = _decimal(match.group("num"))
            if match.group("den") is not None:
                den = _decimal(match.group("den"))[0]
                if den == 0 or value % den != 0:
                    return None
                value = value / den
            if value != value.to_integral_value():
                return None
        except InvalidOperation:  # not a number (`1.2.3`), or too many digits to be exact
            return None
    negative = not separate and match.group("sign") not in (None, "+", "\uff0b")
    return -int(value) if negative else int(value)


def _decimal(text: str) -> tuple[Decimal, bool]:
    """The value of one number's text, and whether it was read as the last of numbers written
    apart (`12 34`: 34, its own number, no sign). Thousands separators are one kind throughout, in
    groups of three after a first group of one to three digits; a comma otherwise is refused."""
    parts = _SPACES.split(text)
    if len(parts) > 1:
        if any("," in part for part in parts):
            raise _Refused(f"the last number mixes separators ({text[:24]!r}): not read as a number")
        joined = ",".join(parts)
        if not _GROUPED.fullmatch(joined):
            return _decimal(parts[-1])[0], True  # numbers written apart: the last one
        text = joined
    text = text.replace("{,}", ",")
    if "," in text:
        if not _GROUPED.fullmatch(text):
            raise _Refused(
                f"the last number's comma is not a thousands separator ({text[:24]!r}: a decimal "
                "comma, or a list?): not read as a number"
            )
        text = text.replace(",", "")
    value = Decimal(text)
    if value.adjusted() >= _MAX_DIGITS:
        raise InvalidOperation
    return value, False


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
        if last is None or last.value is None:
            if last is not None:
                reason = last.reason
            else:
                reason = "empty response" if not text.strip() else "no integer in the response"
            extracted = "" if last is None else last.text[:80]
            return VerifyResult(
                0.0, {"correct": 0.0}, extracted, {"reason": reason, "expected": str(expected)}
            )
        ok = last.value == expected
        return VerifyResult(
            1.0 if ok else 0.0,
            {"correct": 1.0 if ok else 0.0},
            str(last.value),
            {"expected": str(expected), "reason": "match" if ok else "wrong answer"},
        )
