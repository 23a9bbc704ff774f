r"""math, adversarially (issue 27): per class, answers a policy that read the checker would try
score 0, and right answers in common forms score 1.0. Each class is one test over its payloads, run
through the worker pool as the verifier runs them; a failure lists every payload that broke.

Classes: numbers compared relatively, intervals never equal to finite sets, equation references
answered by equations, false equations as answers, multiple choice, forms math-verify missed
(digit groups, Unicode symbols, repeating decimals, set vs inequality), hedged answers, unbounded
answers. Round three (issue 38): boxes that are not one answer (a hedge inside, an operator
around, two lines, what math-verify reads only in part), Unicode forms (fullwidth digits, dashes,
superscripts), and values too large for math-verify decided exactly or named undecided."""

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.verifier import Environment
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import task

pytestmark = pytest.mark.asyncio(loop_scope="module")
HERE = Path(__file__).resolve().parent.parent
Case = tuple[str, str]  # (expected_answer, response)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[Environment]:
    async with load_env(HERE) as loaded:
        await loaded.context.workers.warm()
        yield loaded


async def scores(env: Environment, cases: list[Case]) -> dict[Case, Any]:
    out = {}
    for expected, response in cases:
        r = await check(env, task(expected), answer(response))
        out[(expected, response)] = (r.reward, r.details.get("reason"))
    return out


async def assert_all(env: Environment, cases: list[Case], reward: float) -> None:
    got = await scores(env, cases)
    wrong = {case: r for case, r in got.items() if r[0] != reward}
    assert not wrong, f"should score {reward}: {wrong}"


NUMBERS_WRONG = [
    ("6.626\\times10^{-34}", "\\boxed{10^{-40}}"),
    ("6.626\\times10^{-34}", "\\boxed{0}"),
    ("6.626\\times10^{-34}", "\\boxed{6.7\\times10^{-34}}"),
    ("1.6\\times10^{-19}", "\\boxed{0.0}"),
    ("0.0000001", "\\boxed{0}"),
    ("2\\times10^{-8}", "\\boxed{10^{-8}}"),
    ("3\\times10^{-7}", "\\boxed{0.0000001}"),
    ("5\\times10^{-7}", "\\boxed{0.000001}"),
    ("(1, 10^{-9})", "\\boxed{(1, 0)}"),
    ("10^{-12}", "\\boxed{-10^{-12}}"),
]
NUMBERS_RIGHT = [
    ("6.626\\times10^{-34}", "\\boxed{6.626 \\times 10^{-34}}"),
    ("6.626\\times10^{-34}", "\\boxed{6.6260\\times10^{-34}}"),
    ("\\frac{1}{3}", "\\boxed{0.333333}"),
    ("\\frac{1}{81}", "\\boxed{0.012346}"),
    ("0.5", "\\boxed{\\frac12}"),
    ("10^{-40}", "\\boxed{1\\times10^{-40}}"),
    ("0", "\\boxed{0.0}"),
    ("1234567", "\\boxed{1234567}"),
    ("9\\%", "\\boxed{9\\%}"),
]


INTERVALS_WRONG = [
    ("(0,1)", "\\boxed{\\{0,1\\}}"),
    ("(0,1)", "\\boxed{0, 1}"),
    ("(0,1)", "\\boxed{0.5}"),
    ("(1,2)", "The answer is 1 and 2"),
    ("(1,2)", "\\boxed{1 \\text{ and } 2}"),
    ("x>3", "\\boxed{3, \\infty}"),
    ("x>3", "\\boxed{\\{3, \\infty\\}}"),
    ("[2,5]", "\\boxed{\\{2,5\\}}"),
    ("(-\\infty, 3)", "\\boxed{\\{-\\infty, 3\\}}"),
    ("\\{0,1\\}", "\\boxed{(0,1)}"),
    ("\\{0,1\\}", "\\boxed{[0,1]}"),
    ("0<x<1", "\\boxed{0, 1}"),
]
INTERVALS_RIGHT = [
    ("(0,1)", "\\boxed{(0,1)}"),
    ("(0,1)", "\\boxed{0<x<1}"),
    ("[2,5]", "\\boxed{2\\le x\\le 5}"),
    ("[2,5]", "\\boxed{2 \\leq x \\leq 5}"),
    ("(-\\infty,3)", "\\boxed{x<3}"),
    ("x<3", "\\boxed{(-\\infty,3)}"),
    ("x \\ge 2", "\\boxed{[2, \\infty)}"),
    ("[2, \\infty)", "\\boxed{x \\ge 2}"),
    ("\\{0,1\\}", "\\boxed{\\{1,0\\}}"),
    ("[2,5]", "\\boxed{2≤x≤5}"),
]


EQUATIONS_WRONG = [
    ("x+y+z=1", "\\boxed{1}"),
    ("x^2+y^2=25", "\\boxed{25}"),
    ("2x+3y=6", "\\boxed{6}"),
    ("x+y=1", "\\boxed{x = 1}"),
    ("3", "\\boxed{4 = 3}"),
    ("3", "\\boxed{1+1 = 3}"),
    ("3", "\\boxed{x = 4 = 3}"),
    ("3", "\\boxed{0 = 3}"),
    ("\\frac12", "\\boxed{1 = \\frac{1}{2}}"),
]
EQUATIONS_RIGHT = [
    ("x+y+z=1", "\\boxed{x+y+z=1}"),
    ("x+y+z=1", "\\boxed{1 = x+y+z}"),
    ("x=2", "\\boxed{2}"),
    ("y=2x+1", "\\boxed{y = 1 + 2x}"),
    ("3", "\\boxed{x = 3}"),
    ("3", "\\boxed{1+2 = 3}"),
    ("3", "\\boxed{x = 1 + 2 = 3}"),
    ("f(x) = x^2", "\\boxed{x^2}"),
    ("a_n = 2n", "\\boxed{2n}"),
    ("x+y+z=1", "\\boxed{x+y+z-1=0}"),
]


CHOICE_WRONG = [
    ("C", "**Answer: B**"),
    ("C", "\\boxed{A}"),
    ("C", "The answer could be C or D. Answer: D"),
    ("C", "\\boxed{C} ... on reflection, Answer: D"),
    ("C", "Answer: A, B, C or D"),
    ("C", "\\boxed{C \\text{ or } D}"),
    ("C", "I am not sure."),
    ("(B)", "Answer: Because of the symmetry"),
]
CHOICE_RIGHT = [
    ("C", "**Answer: C**"),
    ("C", "\\boxed{C}"),
    ("C", "So the answer is (C)."),
    ("C", "Answer: $\\text{C}$"),
    ("(C)", "Final answer: **C**"),
    ("C", "C"),
    ("\\text{C}", "\\boxed{\\text{(C)}}"),
    ("B", "It is not A. Answer: B"),
]


FORMS_RIGHT = [
    ("1000", "\\boxed{1\\,000}"),
    ("10000000", "\\boxed{10\\,000\\,000}"),
    ("1000", "\\boxed{1{,}000}"),
    ("\\sqrt{2}", "\\boxed{√2}"),
    ("2\\sqrt{2}", "\\boxed{2√2}"),
    ("\\sqrt{x+1}", "\\boxed{√(x+1)}"),
    ("\\infty", "\\boxed{∞}"),
    ("-\\infty", "\\boxed{-∞}"),
    ("\\frac{1}{3}", "\\boxed{0.\\overline{3}}"),
    ("\\frac{1}{6}", "\\boxed{0.1\\overline{6}}"),
    ("\\frac{8}{7}", "\\boxed{1.\\overline{142857}}"),
    ("\\pi", "\\boxed{π}"),
    ("-5", "\\boxed{\u22125}"),
]
FORMS_WRONG = [
    ("1000", "\\boxed{1\\,001}"),
    ("100", "\\boxed{1\\,000}"),
    ("\\sqrt{3}", "\\boxed{√2}"),
    ("\\frac{1}{3}", "\\boxed{0.\\overline{4}}"),
    ("\\infty", "\\boxed{-∞}"),
]


# Per class: answers that must score 0, and right answers in common forms that must score 1.0.
CLASSES = {
    "numbers_are_compared_relatively": (NUMBERS_WRONG, NUMBERS_RIGHT),
    "intervals_never_equal_finite_sets": (INTERVALS_WRONG, INTERVALS_RIGHT),
    "equations_are_compared_as_equations": (EQUATIONS_WRONG, EQUATIONS_RIGHT),
    "multiple_choice_reads_the_last_letter_given": (CHOICE_WRONG, CHOICE_RIGHT),
    "common_forms_are_read": (FORMS_WRONG, FORMS_RIGHT),
}


@pytest.mark.parametrize(("wrong", "right"), list(CLASSES.values()), ids=list(CLASSES))
async def test_a_class_scores_its_wrong_answers_0_and_its_right_ones_1(
    env: Environment, wrong: list[Case], right: list[Case]
) -> None:
    await assert_all(env, wrong, 0.0)
    await assert_all(env, right, 1.0)


HEDGED = [  # two candidates, no box: 0 whichever one the gold is (math-verify read the first or last)
    ("5", "The answer is 5 or 6."),
    ("6", "The answer is 5 or 6."),
    ("5", "It is either 5 or 6."),
    ("6", "either 5 or 6"),
    ("5", "5 and/or 6"),
    ("6", "5 and/or 6"),
    ("5", "x = 5 or x = 6"),
    ("6", "x = 5 / x = 6"),
    ("5", "$5$ / $6$"),
    ("5", "The answer is 5, or possibly 6."),
    ("5", "The answer is 5 (or 6)."),
    ("\\frac{1}{2}", "Answer: 1/2 or 1/3"),
]
ONE_ANSWER = [  # one answer in a sentence is no hedge
    ("5", "The answer is 5."),
    ("5", "so x = 5, which is odd"),
    ("5", "The answer is 5 or 5."),
    ("\\frac{5}{6}", "The answer is 5/6"),
    ("5", "There are 3 or 4 cases to check.\nSo the total is 5."),
]
SEVERAL_BOXES = [("4", "\\boxed{3} is wrong, \\boxed{4}"), ("3", "\\boxed{3} is wrong, \\boxed{4}")]
UNBOXED_ROOTS_RIGHT = [
    ("\\sqrt{2}", "The answer is √2."),
    ("\\frac{\\sqrt{2}}{2}", "The answer is √2/2."),
    ("3\\sqrt{2}", "so x = 3√2"),
    ("\\sqrt{x+1}", "The answer is √(x+1)."),
]
UNBOXED_ROOTS_WRONG = [
    ("2", "The answer is √2."),
    ("\\sqrt{3}", "The answer is √2."),
    ("\\sqrt{2}", "√2 or √3"),
]


async def test_a_hedged_answer_scores_0_with_the_reason(env: Environment) -> None:
    got = await scores(env, HEDGED)
    bad = {case: r for case, r in got.items() if r[0] != 0.0 or "hedges" not in str(r[1])}
    assert not bad, bad
    await assert_all(env, ONE_ANSWER, 1.0)
    await assert_all(env, SEVERAL_BOXES, 0.0)  # several different boxed answers fail closed


async def test_an_unboxed_root_reads_as_the_boxed_one(env: Environment) -> None:
    await assert_all(env, UNBOXED_ROOTS_RIGHT, 1.0)
    await assert_all(env, UNBOXED_ROOTS_WRONG, 0.0)  # `√2` was read as 2


UNBOUNDED = [
    "\\boxed{10^{10^{10}}}",
    "\\boxed{9^{9^{9}}}",
    "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "\\boxed{10^{1000000}}",
    "\\boxed{100000000!}",
    "\\boxed{(10^{10})!}",
    "\\boxed{\\binom{10^{12}}{10^{11}}}",
    "\\boxed{\\prod_{k=1}^{10^{9}} k}",
]


async def test_an_unbounded_answer_is_a_0_with_a_reason_not_a_timeout(env: Environment) -> None:
    """`\\boxed{10^{10^{10}}}` made math-verify compute for minutes: CHECK_TIMEOUT, retried, so a
    policy traded a 0 for a dropped sample. It is never evaluated exactly: decided by its magnitude
    or named undecided, 0 and why."""
    got = await scores(env, [("5", text) for text in UNBOUNDED])
    bad = {case: r for case, r in got.items() if r[0] != 0.0 or "too large" not in str(r[1])}
    assert not bad, bad
    for large in ("2^{100}", "2^{30000}", "x^{100}", "20!"):  # large, not unbounded
        assert (await check(env, task(large), answer(f"\\boxed{{{large}}}"))).reward == 1.0, large


HOSTILE_TEXT = [
    " " * 200_000,
    "answer" + " " * 200_000,
    "\\boxed{" + " " * 200_000,
    ("the answer is " + " " * 50) * 4000,
    "\\boxed{\\text{" + " " * 100_000,
    "1\\," * 50_000,
    "√(" * 50_000,
    "0.\\overline{" * 30_000,
]


async def test_the_rules_read_a_hostile_text_in_one_pass(env: Environment) -> None:
    """The added text rules (choice letters, digit groups, roots, repeating decimals) use bounded
    or possessive patterns: a response built to make them backtrack is read in milliseconds (it
    would cost two worker timeouts, then a 0)."""
    for expected in ("C", "5"):
        for text in HOSTILE_TEXT:
            started = time.monotonic()
            r = await check(env, task(expected), answer(text))
            assert r.reward == 0.0 and not r.details.get("timed_out"), (expected, text[:30], r.details)
            assert time.monotonic() - started < 8.0, (expected, text[:30])  # generous: a loaded host


# Round three (issue 38). For a reference that is one value, the boxed answer must be one value,
# read whole: each of these was read as 3 or 4 (math-verify turned `or` into a comma, or dropped a
# command it did not know and read what was left), or the box was only part of the answer.
BOX_NOT_ONE_ANSWER = [
    ("3", "\\boxed{3 \\text{ (or } 4)}"),
    ("4", "\\boxed{3 \\text{ (or } 4)}"),
    ("3", "\\boxed{3} (or \\boxed{4} if rounding up)"),
    ("4", "\\boxed{3} (or \\boxed{4} if rounding up)"),
    ("3", "\\boxed{3 \\\\ 4}"),
    ("4", "\\boxed{3 \\\\ 4}"),
    ("3", "\\boxed{3}^2"),
    ("3", "\\boxed{3}²"),
    ("3", "\\boxed{3}+1"),
    ("3", "\\boxed{3} \\cdot 2"),
    ("3", "\\boxed{3}\\times 10^{-2}"),
    ("3", "-\\boxed{3}"),
    ("3", "2\\boxed{3}"),
    ("9", "\\sqrt{\\boxed{9}}"),
    ("3", "\\frac{1}{\\boxed{3}}"),
    ("2", "10^{\\boxed{2}}"),
    ("3", "\\boxed{3}, or possibly 4"),
    ("4", "\\boxed{3} (or 4)"),
    ("4", "\\boxed{3 \\text{ maybe } 4}"),
    ("4", "\\boxed{3 \\text{ and maybe } 4}"),
    ("3", "\\boxed{3 \\text{ if } n \\text{ is odd}}"),
    ("4", "\\boxed{3 \\hbox{or} 4}"),
    ("4", "\\boxed{3 \\operatorname{or} 4}"),
    ("4", "\\boxed{\\text{3 or 4}}"),
    ("4", "\\boxed{3 \\lor 4}"),
    ("4", "\\boxed{3 \\mid 4}"),
    ("4", "\\boxed{3 | 4}"),
    ("4", "\\boxed{3 \\to 4}"),
    ("4", "\\boxed{3 \\unknowncmd 4}"),
    ("7", "\\boxed{3 4}"),
    ("7", "\\boxed{3 \\quad 4}"),
    ("7", "\\boxed{\\{3\\} 4}"),
    ("4", "$3 \\lor 4$"),
    ("4", "The answer is $x = 3 \\mid 4$."),
    ("4", "\\(3 \\unknowncmd 4\\)"),
    ("5", "\\boxed{6} is what I get. Earlier I thought " + "x" * 80 + " ~~\\boxed{5}~~"),
    ("5", "\\boxed{6} ... " + "x" * 80 + " <del>\\boxed{5}</del>"),
    ("5", "\\cancel{\\boxed{5}}"),
    ("5", "\\boxed{6}<think>or \\boxed{5}?</think>"),  # thought, never answered
    ("5", "<think>\\boxed{5}</think>I do not know."),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}} (or 1/3)"),  # whatever the box holds
    ("\\sqrt{2}", "\\boxed{\\sqrt{2}}, or maybe $\\sqrt{3}$"),
]
# One answer in forms the checks above must not refuse.
BOX_ONE_ANSWER = [
    ("5", "\\boxed{5} cm"),
    ("5", "$x = \\boxed{5}$"),
    ("5", "Answer:\n- \\boxed{5}"),
    ("5", "**Answer:** \\boxed{5}"),
    ("5", "So it is \\boxed{5}!"),
    ("5", "\\boxed{5 \\text{ cm}}"),
    ("5", "\\boxed{5}\n\nThere are 3 or 4 cases to check."),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}"),
    ("3, 4", "\\boxed{3 \\text{ or } 4}"),  # the reference lists two: not a hedge
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}} (or equivalently 0.5)"),
    ("\\frac{\\sqrt{3}}{2}", "\\boxed{\\dfrac{\\sqrt{3}}{2}}"),
    ("3", "\\boxed{|-3|}"),
    ("90", "\\boxed{90^\\circ}"),
    ("1000", "\\boxed{1\\,000}"),
    ("5", "$\\therefore x = 5$"),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}} (or 0.5)"),  # one value in two forms
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{2}} or so I think"),
]
UNICODE_RIGHT = [
    ("3", "３"),
    ("3", "The answer is ３."),
    ("3", "3."),
    ("8", "2³"),
    ("8", "\\boxed{2³}"),
    ("x^2", "x²"),
    ("-3", "–3"),
    ("-3", "\\boxed{–3}"),
    ("-3", "\\boxed{－３}"),
    ("30", "\\boxed{3\u200b0}"),
    ("\\frac{1}{1000}", "\\boxed{10⁻³}"),
]
UNICODE_WRONG = [("3", "–3"), ("3", "2³"), ("23", "2³"), ("3", "\\boxed{3\u200b0}")]


async def test_a_box_that_is_not_one_answer_scores_0_with_the_reason(env: Environment) -> None:
    got = await scores(env, BOX_NOT_ONE_ANSWER)
    bad = {case: r for case, r in got.items() if r[0] != 0.0 or not r[1] or r[1] == "not equivalent"}
    assert not bad, bad  # each refused by name, not by luck of the comparison
    await assert_all(env, BOX_ONE_ANSWER, 1.0)


async def test_unicode_digits_dashes_and_superscripts_are_read(env: Environment) -> None:
    await assert_all(env, UNICODE_RIGHT, 1.0)
    await assert_all(env, UNICODE_WRONG, 0.0)


# NeMo Gym 0.7.0's math_with_judge example_rollouts.jsonl, row 2: a value of ~10^1152 that
# math-verify needs >5 s of sympy to match. Too large to evaluate is not wrong: decided exactly.
NEMO_GOLD = "\\frac{(3-\\sqrt{3})(2-\\sqrt{3})^{2016}+(3+\\sqrt{3})(2+\\sqrt{3})^{2016}}{6}"
NEMO_ANSWER = "\\frac{(1+\\sqrt{3})^{4033}-(1-\\sqrt{3})^{4033}}{2^{2017}\\sqrt{3}}"
LARGE_RIGHT = [
    (NEMO_GOLD, f"\\boxed{{{NEMO_ANSWER}}}"),
    (NEMO_GOLD, f"\\boxed{{{NEMO_GOLD}}}"),
    ("10^{10^{10}}", "\\boxed{10^{10^{10}}}"),
    ("1.1\\times10^{200}", "\\boxed{11 \\times 10^{199}}"),  # a decimal is the number it shows
    ("100!", "\\boxed{\\frac{101!}{101}}"),
    ("x = 2^{400}", "\\boxed{2^{400}}"),  # an assignment: math-verify's, as before
]
LARGE_WRONG = [  # decided: not one digit of the integer part, nor the sixth decimal, may differ
    (NEMO_GOLD, f"\\boxed{{{NEMO_ANSWER} + 1}}"),
    (NEMO_GOLD, f"\\boxed{{{NEMO_ANSWER} + 10^{{-5}}}}"),
    (NEMO_GOLD, f"\\boxed{{2 \\cdot {NEMO_ANSWER}}}"),
    (NEMO_GOLD, "\\boxed{0}"),
    ("5", "\\boxed{10^{10^{10}}}"),
    ("5", "\\boxed{9^{9^{9}}}"),
    ("1.1\\times10^{200}", "\\boxed{1.1000001 \\times 10^{200}}"),
]
LARGE_UNDECIDED = [  # nothing here decides them in bounds: a named outcome, never a silent 0
    ("10^{10^{10}}", "\\boxed{10^{10^{10}} + 1}"),
    ("5", "\\boxed{2^{2^{2^{2^{2^{2}}}}}}"),
    ("x^{10^{9}}", "\\boxed{x^{10^{9}} + 1}"),
]


async def test_too_large_for_math_verify_is_decided_exactly_or_named_undecided(env: Environment) -> None:
    await assert_all(env, LARGE_RIGHT, 1.0)
    got = await scores(env, LARGE_WRONG)
    bad = {case: r for case, r in got.items() if r[0] != 0.0 or "decided exactly" not in str(r[1])}
    assert not bad, bad
    for expected, text in LARGE_UNDECIDED:
        r = await check(env, task(expected), answer(text))
        assert r.reward == 0.0 and r.details.get("undecided") is True, (expected, text, r.details)
        assert r.details["reason"].startswith("undecided"), r.details
