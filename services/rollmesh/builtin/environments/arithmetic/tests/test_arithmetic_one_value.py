r"""arithmetic, round three (issue 38): the final answer is read as ONE value with a number grammar
(number.py), never as the last run of digits. Per class, what a policy that read the checker would
write scores 0 with a reason, and the right answer written in an unusual valid form scores 1.

Classes: fragments (a value whose last digits are the gold: `\frac{10}{2}` for 2, `2^{3}` for 3),
signs and dashes, separators and invisible characters, expressions and operators that are not one
value, forms refused by name (percent, base prefix, words glued to the number)."""

import time
from pathlib import Path

from rollmesh.builtin.environments.arithmetic.number import WINDOW
from rollmesh.builtin.environments.arithmetic.number import final_answer
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import task

HERE = Path(__file__).resolve().parent.parent
Case = tuple[str, str]  # (expected_answer, response)


async def failures(cases: list[Case], reward: float) -> dict[Case, object]:
    """The cases that did not score `reward` (or scored 0 without a reason), with what they got."""
    out: dict[Case, object] = {}
    async with load_env(HERE) as env:
        for expected, text in cases:
            r = await check(env, task(expected), answer(text))
            if r.reward != reward or (reward == 0.0 and not r.details.get("reason")):
                out[(expected, text)] = (r.reward, r.extracted_answer, r.details.get("reason"))
    return out


# Each scored 1.0 at 3f387cd: the last run of digits was the answer.
FRAGMENTS = [
    ("2", "\\frac{10}{2}"),
    ("2", "\\dfrac{10}{2}"),
    ("3", "2^{3}"),
    ("3", "5\\times10^{3}"),
    ("2", "3·10^{2}"),
    ("2", "2½"),
    ("5", "–5"),
    ("5", "- 5"),
    ("5", "-(5)"),
    ("10", "0x10"),
    ("0", "1_000"),
    ("2", "10÷2"),
    ("0", "5\u200b0"),
    ("5", "5‰"),
    ("3", "1e3"),
    ("3", "2³"),
    ("10", "2^10"),
    ("10", "2**10"),
    ("3", "\\boxed{2^{3}}"),
    ("2", "\\left(\\frac{10}{2}\\right)"),
    ("000", "1'000"),
    ("5", "−5"),
    ("5", "\\text{The answer is } -5"),
    ("0", "5\u20640"),  # U+2064 INVISIBLE PLUS: `5+0`, an expression
    ("0", "5\u20620"),  # U+2062 INVISIBLE TIMES: `5×0`
]
SIGNS = [
    ("5", "—5"),  # an em dash: a minus or a dash? refused
    ("5", "±5"),
    ("5", "\\pm 5"),
    ("5", "--5"),
    ("5", "Steps:\n- 5"),  # a list bullet or a minus? refused
    ("5", "\uff0d\uff15"),  # fullwidth minus: -5
]
EXPRESSIONS = [
    ("60", "41 + 19"),
    ("19", "41 + 19"),
    ("5", "10 \\div 2"),
    ("2", "10 \\div 2"),
    ("6", "2 × 3"),
    ("3", "2 \\cdot 3"),
    ("5", "2(5)"),
    ("5", "(2)(5)"),
    ("2", "1/2/2"),
    ("9", "2^3^2"),
    ("20", "10–20"),
    ("19", "60 (41 + 19)"),
]
REFUSED = [
    ("5", "5%"),
    ("5", "5\\%"),
    ("5", "5 percent"),
    ("16", "0x10"),
    ("5", "0b101"),
    ("10", "x10"),
    ("5", "5k"),
    ("10", "\\log 10"),
    ("2", "\\binom{5}{2}"),
    ("3", "\\overline{3}"),
    ("5", "1,000,5"),
    ("5", "1_0_5"),
    ("5", "1.000.005"),
    ("4", "4^{1/2}"),
    ("2", "4^{1/2}"),
    ("1", "1^{10^{10}} + 0"),
    ("1", "\\frac{1}{0}"),
    ("1", "9^{9^{9}}"),
    ("5", "6 ~~5~~"),  # struck through: the writer says it is not the answer
    ("5", "6 <del>5</del>"),
    ("5", "6 \\cancel{5}"),
    ("5", "5\u0336"),  # a combining long stroke overlay: a struck 5
    ("5", "5\u20e0"),  # a combining enclosing circle backslash: "not 5"
    ("5", "5₁₀"),
    ("5", "<think>it is 5</think>I cannot say."),  # thought, never answered
    ("5", "6 <think>or 5?"),  # a think block that never closes
    ("5", "The answer is \\5"),  # a LaTeX control symbol, not a number (raised ValueError: INTERNAL)
    ("5", "is\\5%}"),
    # A sign, an operation or a negation in words, or `≠`, before the last number: it is not the
    # value written (each read as 5, or as the operand, before).
    ("5", "The answer is minus 5."),
    ("5", "The answer is negative 5."),
    ("-5", "The answer is negative 5."),
    ("5", "10 minus 5"),
    ("2", "10 divided by 2"),
    ("2", "10 Divided  By **2**"),
    ("5", "2 times 5"),
    ("2", "10 over 2"),
    ("3", "The answer is 5, not 3."),
    ("5", "The answer is not 5."),
    ("5", "The answer is not **5**"),
    ("5", "x != 5"),
    ("5", "x ≠ 5"),
    ("5", "x \\neq 5"),
]
# Right answers in valid forms a checker reading the last digits scored 0.
RIGHT = [
    ("5", "\\frac{10}{2}"),
    ("5", "\\boxed{\\dfrac{10}{2}}"),
    ("5", "\\frac{-10}{-2}"),
    ("1024", "2^{10}"),
    ("1024", "2^10"),
    ("1024", "2**10"),
    ("8", "2³"),
    ("1000", "10³"),
    ("5000", "5\\times10^{3}"),
    ("5000", "5 \\times 10^3"),
    ("300", "3·10^{2}"),
    ("300", "3 × 10²"),
    ("1000", "1e3"),
    ("1000", "1E+3"),
    ("-3", "–3"),
    ("-5", "−5"),
    ("-5", "- 5"),
    ("-5", "-(5)"),
    ("-5", "\\left( -5 \\right)"),
    ("-5", "\uff0d\uff15"),
    ("1000", "1_000"),
    ("1000", "1'000"),
    ("1000", "1’000"),
    ("1000000", "1\u2009000\u2009000"),
    ("50", "5\u200b0"),
    ("50", "5\u2060\ufeff0"),
    ("50", "5\u200f0"),  # a right-to-left mark
    ("50", "\u202e5\u202c0"),  # a bidirectional override and its end
    ("3", "\uff13"),
    ("3", "٣"),
    ("42", "The answer is **42**."),
    ("-8", "(-2)^3"),
    ("-4", "-2^2"),
    ("5", "\\frac{5}{1}"),
    ("3", "6/2"),
    ("5", "\\boxed{5}"),
    ("5", "\\text{5}"),
    ("5", "~~6~~ 5"),  # the struck one is not the last
    ("5", "≈5"),
    ("5", "<think>maybe 6</think>5"),
    ("5", "Not 4. The answer is 5."),  # a negation earlier does not touch the final value
    ("5", "It cannot be 4: moreover, x = 5"),  # words ending in `not`, `over` are other words
    ("5", "The knot count is 5"),
    ("5", "maybe 6...</think>\nThe answer is 5."),  # thinking the prompt opened
]


async def test_a_value_ending_in_the_gold_digits_scores_0() -> None:
    assert not await failures(FRAGMENTS, 0.0)


async def test_signs_that_cannot_be_read_without_guessing_score_0() -> None:
    assert not await failures(SIGNS, 0.0)


async def test_an_expression_is_not_one_value() -> None:
    assert not await failures(EXPRESSIONS, 0.0)


async def test_forms_refused_by_name_score_0() -> None:
    assert not await failures(REFUSED, 0.0)


async def test_right_answers_in_unusual_forms_score_1() -> None:
    assert not await failures(RIGHT, 1.0)


async def test_each_refusal_names_its_class() -> None:
    async with load_env(HERE) as env:
        reasons = {
            "10÷2": "expression",
            "41 + 19": "expression",
            "2(5)": "implicit product",
            "5‰": "percentage",
            "0x10": "base prefix",
            "x10": "part of a word",
            "5k": "runs into a word",
            "2^3^2": "chained powers",
            "4^{1/2}": "fractional power",
            "9^{9^{9}}": "more than 4000 digits",
            "\\binom{5}{2}": "argument of `\\binom`",
            "—5": "em dash",
            "±5": "two values",
            "--5": "two signs",
            "1_0_5": "underscore is not a thousands separator",
            "1.000.005": "more than one '.'",
            "2½": "not an integer",
            "so \\5": "LaTeX command",
            "10 divided by 5": "follows 'divided by'",
            "minus 5": "follows 'minus'",
            "it is not 5": "follows 'not'",
            "x != 5": "follows `≠`",
        }
        got = {}
        for text, why in reasons.items():
            r = await check(env, task("5"), answer(text))
            if r.reward != 0.0 or why not in r.details["reason"] or not r.extracted_answer:
                got[text] = r.details
        assert not got


async def test_what_was_written_is_shown_and_the_value_is_extracted() -> None:
    async with load_env(HERE) as env:
        r = await check(env, task("5"), answer("It is \\frac{10}{2}."))
        assert (r.reward, r.extracted_answer) == (1.0, "5")
        zero_width = await check(env, task("7"), answer("so 5\u200b0"))
        assert zero_width.extracted_answer == "50" and zero_width.details["reason"] == "wrong answer"
        refused = await check(env, task("5"), answer("roughly 5‰ of it"))
        assert refused.extracted_answer == "5" and "percentage" in refused.details["reason"]


async def test_hostile_values_are_read_in_bounded_time() -> None:
    """The check runs on the event loop: a value is at most VALUE_CHARS long, nesting and digits
    are bounded, so no answer makes it slow (each of these is read in milliseconds)."""
    async with load_env(HERE) as env:
        hostile = [
            "2^{" * 1000 + "2" + "}" * 1000,
            "(" * 4000 + "5",  # (brackets that never close are not part of the value: 5)
            "\\frac{" * 1000 + "1}{2}" * 1000,
            "9" + "⁹" * 4000,
            "".join("(9^{1000}" for _ in range(40)) + ")" * 40,
            "2^{2^{2^{2^{2^{2}}}}}",
            "10^{4000}\\times10^{4000}",
            "\\left(" * 500 + "5" + "\\right)" * 500,
            "1e" * 10000,
            "5" + "\u200b" * 100000,
        ]
        for text in hostile:
            started = time.monotonic()
            r = await check(env, task("5"), answer(text))
            assert time.monotonic() - started < 1.0 and r.details["reason"], text[:40]


async def test_a_value_cut_by_the_bounds_is_refused_not_read_in_part() -> None:
    long_value = "1" + ",000" * 2000
    read = final_answer(long_value)
    assert read is not None and read.value is None and "longer than" in read.reason
    far = "5" + " words" * (WINDOW // 4)
    assert final_answer(far) is None  # no number in the last WINDOW characters: no answer
