"""arithmetic, adversarially (issue 27): per class, answers a policy that read the checker would try
score 0, and right answers in common forms score 1.0.

Classes: thousands separators (a wrong answer read through a fragment, a right one written with
separators), factorials, roots, and commas that are not thousands separators (refused, never
guessed)."""

from pathlib import Path

import pytest

from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import task

HERE = Path(__file__).resolve().parent.parent

# (class, answer text, expected): each scores 0.
WRONG = [
    # a thousands separator read as two numbers matched the last group
    ("separator", "5 000", "0"),
    ("separator", "5\\,000", "0"),
    ("separator", "\\boxed{5{,}000}", "0"),
    ("separator", "5\u202f000", "0"),
    ("separator", "12 345", "345"),
    ("separator", "1\\,000\\,000", "0"),
    ("separator", "5,000 000", "0"),  # two kinds of separator: refused
    ("separator", "5 000", "5"),
    # a factorial read as its argument
    ("factorial", "5!", "5"),
    ("factorial", "5!", "120"),  # refused, not evaluated either
    ("factorial", "\\boxed{3!}", "3"),
    ("factorial", "The answer is 4!", "4"),
    ("factorial", "10!!", "10"),
    # a root read as its radicand
    ("root", "√25", "25"),
    ("root", "√25", "5"),
    ("root", "\\sqrt{49}", "49"),
    ("root", "\\sqrt[3]{27}", "27"),
    ("root", "sqrt(16)", "16"),
    ("root", "∛ 8", "8"),
    ("root", "\\boxed{\\sqrt{ 9 }}", "9"),
    ("root", "math.isqrt(25)", "25"),
    ("root", "the square root of 25", "25"),
    ("power", "5 squared", "5"),
    ("power", "3 Cubed.", "3"),
    # a comma that is not a thousands separator: a decimal comma or a list, never guessed
    ("comma", "1,5", "5"),
    ("comma", "1,5", "15"),
    ("comma", "1,5", "1"),
    ("comma", "12,34", "34"),
    ("comma", "3,14159", "3"),
    ("comma", "1,50,000", "0"),  # Indian grouping: refused, not read as its last group
    ("comma", "1,2,3", "3"),
    ("comma", "1234,567", "567"),
]

# (answer text, expected): each scores 1.0.
RIGHT = [
    ("5,000", "5000"),
    ("5 000", "5000"),
    ("5\\,000", "5000"),
    ("\\boxed{5{,}000}", "5000"),
    ("5\\ 000", "5000"),
    ("5\u00a0000", "5000"),
    ("5\u2009000", "5000"),
    ("5\u202f000", "5000"),
    ("The total is 1 234 567.", "1234567"),
    ("$1{,}000{,}000$", "1000000"),
    ("\u22125 000", "-5000"),
    ("5 000.0", "5000"),
    ("so 2 + 3 = 5.", "5"),
    ("It is 5! No wait, it is 6", "6"),  # a factorial earlier in the text is not the answer
    ("\\sqrt{25} = 5", "5"),
    ("1, 2, 3", "3"),  # separate numbers, written apart
    ("x != 4, so x = 7", "7"),
    ("5 squared is 25", "25"),
    ("the square root of 25 is 5", "5"),
]


@pytest.mark.parametrize(("kind", "text", "expected"), WRONG)
async def test_a_wrong_or_unreadable_answer_scores_0(kind: str, text: str, expected: str) -> None:
    async with load_env(HERE) as env:
        r = await check(env, task(expected), answer(text))
        assert r.reward == 0.0, (kind, text, expected, r)


@pytest.mark.parametrize(("text", "expected"), RIGHT)
async def test_a_right_answer_in_a_common_form_scores_1(text: str, expected: str) -> None:
    async with load_env(HERE) as env:
        r = await check(env, task(expected), answer(text))
        assert (r.reward, r.extracted_answer) == (1.0, expected), (text, r)


async def test_a_refusal_names_why_and_shows_what_was_written() -> None:
    reasons = {
        "5!": "factorial",
        "√25": "under a root",
        "\\sqrt{25}": "under a root",
        "1,5": "not a thousands separator",
        "5,000 000": "mixes separators",
    }
    async with load_env(HERE) as env:
        for text, why in reasons.items():
            r = await check(env, task("5"), answer(text))
            assert r.reward == 0.0 and why in r.details["reason"], (text, r.details)
            assert r.extracted_answer and r.extracted_answer in text, (text, r.extracted_answer)
