r"""math's check with each reference read once per worker (grading.reference, kept) against reading
it afresh on every check (as before): the same verdict, reason and extracted answer over every
(reference, response) pair the math tests hold and a fixed-seed corpus of generated responses
(boxes, hedges, think blocks, LaTeX, Unicode digits and dashes, values too large for math-verify),
several responses per reference. The parts rewritten for it are checked against what they
replaced: last_box against one pass over every character, for_decide_large against the bounds
taken afresh on both sides."""

from __future__ import annotations

import ast
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollmesh.builtin.environments.math import grading
from rollmesh.mesh.answer_text import _BOX
from rollmesh.mesh.answer_text import last_box
from rollmesh.verifier.loader import import_file

HERE = Path(__file__).resolve().parent.parent
SEED = 38_40
Case = tuple[str, str]  # (expected_answer, response)

MATRIX = "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"
GOLDS = ["68", "-3", "0", "\\frac{5}{6}", "0.5", "\\sqrt{2}", "2\\sqrt{3}", "x=3", "(0,1)", "\\{1,2\\}"]
GOLDS += ["C", "(C)", "\\pi", "10^{-7}", "10^{100}", "10^{10^{10}}", "(2+\\sqrt{3})^{2016}", "x^2+1"]
GOLDS += ["[1, 2)", "x>3", "1000000", "\\infty", "9!", "\\frac{1}{3}", "3.14", "e^{2}", "{,}", MATRIX]
ANSWERS = ["68", "-3", "3", "\\frac{10}{12}", "\\frac12", "0.5", "\\sqrt{2}", "√2", "2³", "３", "–3", "x = 3"]
ANSWERS += ["(0,1)", "\\{1,2\\}", "C", "10^{100}", "10^{10^{10}}", "1\\,000\\,000", "0.\\overline{3}", "π"]
ANSWERS += ["3 \\text{ (or } 4)", "3 \\lor 4", "3 \\quad 4", "3 \\\\ 4", "\\infty", "9!", "x^2 + 1", "e^2"]
FORMS = [
    "\\boxed{{{}}}",
    "${}$",
    "{}",
    "The answer is {}.",
    "\\[ {} \\]",
    "**Answer: {}**",
    "\\boxed{{{}}}^2",
]
FORMS += [
    "-\\boxed{{{}}}",
    "\\boxed{{{}}} (or \\boxed{{4}} if rounding up)",
    "$x = {}$ or $x = 5$",
    "~~\\boxed{{{}}}~~",
]
FORMS += [
    "<think>\\boxed{{7}}</think>\\boxed{{{}}}",
    "\\boxed{{{}}}<think>\\boxed{{7}}",
    "\\boxed{{1}} so \\boxed{{{}}}",
]
FORMS += ["\\fbox{{{}}}", "\\boxed {{ {} }}", "Answer: {} / 6", "{} or 6", "\\boxed{{\\boxed{{{}}}}}"]
NOISE = [
    " ",
    "\n",
    "{",
    "}",
    "$",
    "\\",
    "^",
    "or",
    "\u200b",
    "\uff13",
    "\u2212",
    "\\boxed{",
    "</think>",
    "~~",
]


def payload_pairs() -> list[Case]:
    """Every (reference, response) pair of string constants in the math tests."""
    found: set[Case] = set()
    for path in sorted((HERE / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Tuple) and len(node.elts) == 2:
                a, b = node.elts
                if isinstance(a, ast.Constant) and isinstance(b, ast.Constant):
                    if isinstance(a.value, str) and isinstance(b.value, str):
                        found.add((a.value, b.value))
    return sorted(found)


def generated(seed: int, count: int) -> Iterator[Case]:
    rng = random.Random(seed)
    for _ in range(count):
        gold = rng.choice(GOLDS)
        written = gold if rng.random() < 0.4 else rng.choice(ANSWERS)
        response = rng.choice(["", "So ", "Adding gives ", "x \\to 3, "]) + rng.choice(FORMS).format(written)
        if rng.random() < 0.3:
            at = rng.randint(0, len(response))
            response = response[:at] + rng.choice(NOISE) + response[at:]
        yield gold, response


@pytest.fixture(scope="module")
def check() -> Any:
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout is disabled" warnings
    return import_file(HERE / "env.py").check


def test_a_kept_reference_gives_the_verdict_a_fresh_one_gives(check: Any) -> None:
    cases = [*payload_pairs(), *generated(SEED, 1200)]
    fresh = []
    for expected, response in cases:
        grading._cached_reference.cache_clear()  # read afresh, as every check did before
        fresh.append(check(expected, response))
    grading._cached_reference.cache_clear()
    kept = [check(expected, response) for expected, response in cases]
    assert kept == fresh
    assert grading._cached_reference.cache_info().hits > 1000  # the kept references were used
    verdicts = {(out["correct"], out["reason"].split(" (")[0].split(":")[0]) for out in fresh}
    assert len(verdicts) > 10 and any(out["correct"] for out in fresh)  # of many kinds, some right


def test_a_reference_that_can_change_is_never_used_again() -> None:
    kept = grading.reference("\\frac{5}{6}")
    assert kept.immutable and grading.reference("\\frac{5}{6}") is kept
    matrix = grading.reference(MATRIX)  # sympy's Matrix is mutable: read afresh every time
    assert not matrix.immutable and grading.reference(MATRIX) is not matrix
    assert grading.reference(MATRIX).parsed[0] == matrix.parsed[0]
    long = "1+" * grading.CACHED_CHARS + "1"
    assert grading.reference(long) is not grading.reference(long)  # too long to keep


def _for_decide_large_afresh(gold: list[Any], pred: list[Any]) -> bool:
    """for_decide_large as it was: every bound taken on the parsed values themselves."""
    import sympy

    if any(grading.too_large(x) for x in (*gold, *pred) if not isinstance(x, str)):
        return True
    first = (gold[0], pred[0])
    if not all(isinstance(x, sympy.Expr) and not x.free_symbols for x in first):
        return False
    try:
        return max(grading.log10_bound(x) for x in first) > grading.EXACT_DIGITS
    except Exception:
        return False


def test_for_decide_large_is_the_bounds_taken_afresh() -> None:
    from math_verify import parse

    values = [
        *GOLDS,
        *ANSWERS,
        "10^{10^{100}}",
        "(1+\\sqrt{3})^{4033}",
        "100!",
        "2^{2^{2^{2^{2}}}}",
        "\\{x\\}",
    ]
    parsed = [(text, parse(f"${grading.normalize(text)}$", parsing_timeout=None)) for text in values]
    decided = 0
    for gold_text, gold in parsed:
        if not gold:
            continue
        ref = grading.reference(gold_text)
        for _, pred in parsed:
            if pred:
                want = _for_decide_large_afresh(list(ref.parsed), pred)
                assert grading.for_decide_large(ref, pred) == want, (gold_text, pred)
                decided += want
    assert decided > 20


def _last_box_char_by_char(text: str) -> tuple[int, int, int] | None:
    """last_box as it was: one pass over every character."""
    offset = max(0, len(text) - 100_000)
    tail = text[offset:]
    boxes = list(_BOX.finditer(tail))
    if not boxes:
        return None
    closes: dict[int, int] = {}
    opened: list[int] = []
    for i, ch in enumerate(tail):
        if ch == "{":
            opened.append(i)
        elif ch == "}" and opened:
            closes[opened.pop()] = i
    for m in reversed(boxes):
        close = closes.get(m.end() - 1)
        if close is not None:
            return m.start() + offset, m.end() + offset, close + offset
    return None


def test_last_box_finds_what_one_pass_over_every_character_found() -> None:
    rng = random.Random(SEED)
    pieces = ["{", "}", "\\boxed{", "\\fbox{", "\\boxed {", "x", "1", " ", "\\frac{1}{2}", "}}", "{{"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(20_000)]
    texts += ["\\boxed{" * 5000 + "1", "\\boxed{1}" + "{" * 100_001, "\\boxed{" + "x" * 100_000 + "}"]
    found = 0
    for text in texts:
        want = _last_box_char_by_char(text)
        assert last_box(text) == want, text
        found += want is not None
    assert 2000 < found < len(texts) - 2000
