r"""arithmetic's common case (number.plain_digits) against the full reading (number.read_final_answer):
the same Reading, and the same verdict, reason and extracted answer from the environment, over
every payload the arithmetic, math and reasoning-gym tests hold (forgeries, hostile and right
answers in unusual forms) and a fixed-seed corpus of generated responses: plain answers mutated
one to three times with the characters the reading treats specially (signs, dashes, separators,
LaTeX, roots, strikes, think blocks, Unicode digits, zero-width characters), lengths past the
reading's bounds, and numbers of up to thousands of digits."""

from __future__ import annotations

import ast
import random
import sys
from collections.abc import Iterator
from pathlib import Path

from rollmesh.builtin.environments.arithmetic.number import WINDOW
from rollmesh.builtin.environments.arithmetic.number import final_answer
from rollmesh.builtin.environments.arithmetic.number import plain_digits
from rollmesh.builtin.environments.arithmetic.number import read_final_answer
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import task

HERE = Path(__file__).resolve().parent.parent
ENVIRONMENTS = HERE.parent
SEED = 38_40
GENERATED = 60_000  # texts; about three seconds

# What comes before the answer, what leads and follows it, and what a mutation puts anywhere.
WORDS = ["The answer is", "Answer:", "answer is", "x =", "so", "Total", "is", "of", "root of", "sqrt"]
WORDS += [
    "cbrt",
    "\\times",
    "\\quad",
    "\\text{is}",
    "e",
    "E",
    "5e",
    "0x",
    "x",
    "\\:",
    "\\=",
    "==",
    "OF",
    "Sqrt",
    # a sign, operation or negation in words, `!=`, and words that only end like one
    "minus",
    "Negative",
    "divided by",
    "not",
    "NOT",
    "x !=",
    "cannot",
    "moreover",
    "nearby",
]
LEADS = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n",
    " **",
    "**",
    " $",
    "$",
    ": ",
    " = ",
    "\t",
    " \u00a0",
    "\\,",
    "~",
    "\r\n",
]
ENDS = [
    "",
    ".",
    "**",
    "**.",
    "$",
    "$.",
    " ",
    "\n",
    ".\n",
    ". ",
    "!",
    "%",
    "\\%",
    " squared",
    " per cent",
    ",",
]
ENDS += [")", "}", "$$", "**\n\n", "...", " \n \n", "\t", "\r", "\x0b", "\x1c", "e3", "^2", "²", "½", "/2"]
SPECIAL = [
    *"0123456789 \n\t.,;:=+-*/^_'~$!%()[]{}<>\\|eExXbo",
    "**", "~~", "<del>", "</del>", "<s>", "<think>", "</think>", "\\frac{", "\\boxed{", "\\sqrt",
    "\\times", "\\cdot", "\\cancel{", "\\pm", "\\left(", "\\right)", "\\text{", "\\,", "{,}", "\\ ",
    "\u2212", "\u2013", "\u2014", "\u00b1", "\u221a", "\u00bd", "\u00b2", "\u2070", "\uff13", "\u0663",
    "\u200b", "\u2064", "\u00a0", "\u2009", "\u0336", "\u20e0", "\u00d7", "\u00b7", "\u00f7", "\u2030",
    "\u2019", "\u2215", "\ufeff", "\U0001d7ce", "\u00e9", "\u03c0", "\x0c", "\x1c", "\u2028", "\u3000",
]  # fmt: skip


SEPARATORS = [",", " ", "{,}", "\\,", "_", "'", "\u2009", "."]


def payloads() -> list[str]:
    """Every string constant in the arithmetic, math and reasoning-gym tests."""
    found: set[str] = set()
    for folder in ("arithmetic", "math", "reasoning_gym"):
        for path in sorted((ENVIRONMENTS / folder / "tests").glob("test_*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and len(node.value) < 20_000
                ):
                    found.add(node.value)
    return sorted(found)


def number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.55:
        return str(rng.randrange(10 ** rng.choice([1, 1, 2, 2, 3, 4, 6])))
    if kind < 0.65:
        return "0" * rng.randint(1, 3) + str(rng.randrange(1000))
    if kind < 0.75:
        return "".join(rng.choice("0123456789") for _ in range(rng.choice([63, 64, 65, 66, 100, 1100, 4001])))
    if kind < 0.85:
        return str(rng.randrange(1, 1000)) + rng.choice(SEPARATORS) + f"{rng.randrange(1000):03d}"
    return f"{rng.randrange(100)}.{rng.randrange(100)}"


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 3)):
        at = rng.randint(0, len(text))
        piece = rng.choice(SPECIAL)
        action = rng.random()
        if action < 0.5:
            text = text[:at] + piece + text[at:]
        elif action < 0.8:
            text = text[:at] + piece + text[at + 1 :]
        else:
            text = text[:at] + text[at + rng.randint(1, 3) :]
    return text


def generated(seed: int, count: int) -> Iterator[str]:
    """`count` responses, most of them plain (`The answer is 68.`) or one to three edits from it."""
    rng = random.Random(seed)
    for _ in range(count):
        if rng.random() < 0.6:  # the common forms
            text = (
                rng.choice(WORDS[:4])
                + rng.choice(LEADS[:8])
                + str(rng.randrange(10**4))
                + rng.choice(ENDS[:10])
            )
        else:
            text = rng.choice(WORDS) + rng.choice(LEADS) + number(rng) + rng.choice(ENDS)
        roll = rng.random()
        if roll < 0.1:
            text = rng.choice(WORDS) + " " + text
        elif roll < 0.15:
            text = "x" * rng.choice([WINDOW - 40, WINDOW - 5, WINDOW, WINDOW + 3, 3 * WINDOW]) + " " + text
        elif roll < 0.2:
            text = text + rng.choice([" ", "\n", "\t"]) * rng.choice([60, 63, 64, 65, 70, 1030, 5000])
        elif roll < 0.25:
            text = text.replace(" ", " " * rng.choice([63, 64, 65, 1030]), 1)
        elif roll < 0.3:
            text = rng.choice(["<think>6</think>", "~~", "<del>", "6 ~~", "<s>x</s> "]) + text
        elif roll < 0.35:
            text = rng.choice(SPECIAL) * rng.randint(1, 2100) + text
        if rng.random() < 0.4:
            text = mutate(text, rng)
        yield text


def test_the_common_case_reads_as_the_full_reading() -> None:
    texts = payloads()
    plain = 0
    for text in [*texts, *generated(SEED, GENERATED)]:
        full = read_final_answer(text)
        assert final_answer(text) == full, text
        digits = plain_digits(text)
        if digits is not None:
            plain += 1
            assert full is not None and full.text == digits and full.value == int(digits) and not full.reason
    # Both sides of the boundary are exercised: the common case and what falls back.
    assert len(texts) > 400 and GENERATED * 0.25 < plain < GENERATED * 0.75, (len(texts), plain)


async def test_the_environment_scores_every_text_as_through_the_full_reading() -> None:
    texts = [*payloads(), *generated(SEED + 1, GENERATED // 4)]
    async with load_env(HERE) as env:
        module = sys.modules[type(env).__module__]
        fast = [await check(env, task(expected), answer(text)) for text in texts for expected in ("68", "5")]
        module.plain_digits = lambda text: None  # type: ignore[attr-defined]
        try:
            full = [
                await check(env, task(expected), answer(text)) for text in texts for expected in ("68", "5")
            ]
        finally:
            module.plain_digits = plain_digits  # type: ignore[attr-defined]
    assert [(r.reward, r.components, r.extracted_answer, r.details) for r in fast] == [
        (r.reward, r.components, r.extracted_answer, r.details) for r in full
    ]
    assert sum(r.reward for r in fast) > 100  # right answers among them, not only refusals
