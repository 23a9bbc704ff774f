"""Issue #38's code classes, closed by construction: payloads of our own, written as a policy that
has read the checker's source would write them, each scored through the `code` environment in both
sandbox modes. A forgery scores 0, a right answer in an unusual but valid form scores 1, and a task
no answer could pass is BAD_TASK (never INTERNAL).

Classes (docs/security.md, "Verdicts of the code environment"):
  errors   no verify input is an error of the verifier's (5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from rollmesh.verifier import BadTask, Environment
from rollmesh.verifier.testing import answer, check, task
from tests.integration import test_code_clean_interpreter

env = test_code_clean_interpreter.env  # the fixture: one environment per sandbox mode


@dataclass(frozen=True)
class Payload:
    """`tests`: assert strings, or {"inputs", "outputs"} (stdin/stdout); `want`: the reward, or
    None for BAD_TASK; `why`: a phrase the failure's reason must hold (a forgery scored 0)."""

    tests: Any
    code: str
    want: float | None
    why: str = ""


def answers(value: str) -> str:
    """A preamble: the solution's process answers every call with `value` (wire form), whatever
    its functions compute."""
    return test_code_clean_interpreter.hijack(f"lambda req: {value}")


ERRORS: dict[str, Payload] = {
    "test_nested_brackets": Payload(["assert f() == " + "[" * 100_000], "def f():\n    return 1\n", None),
    "test_unary_chain": Payload(["assert f() == " + "-" * 500_000 + "1"], "def f():\n    return -1\n", None),
    "test_long_sum": Payload(["assert f() == " + "1+" * 100_000 + "1"], "def f():\n    return 1\n", None),
    "test_attribute_chain": Payload(["assert f()" + ".x" * 200_000], "def f():\n    return 1\n", None),
    "unit_tests_nested_argument": Payload(
        {"unit_tests": {"inputs": ["[" * 50_000 + "]" * 50_000], "outputs": ["1"], "fn_name": "f"}},
        "class Solution:\n    def f(self, x):\n        return 1\n",
        None,
    ),
    "unit_tests_literal_too_deep_to_compile": Payload(
        {"unit_tests": {"inputs": ["[" * 300 + "]" * 300], "outputs": ["1"], "fn_name": "f"}},
        "class Solution:\n    def f(self, x):\n        return 1\n",
        None,
    ),
    "key_of_its_own_compared": Payload(
        ["assert pairs() == {(1, 2): 3}"],
        "class P:\n    def __eq__(self, o):\n        return True\n"
        "    def __hash__(self):\n        return hash((1, 2))\n"
        "def pairs():\n    return {P(): 3}\n",
        0.0,
        "AssertionError",
    ),
    "forged_reference_key": Payload(
        ["assert pairs() == {(1, 2): 3}"],
        answers("['dict', [[['ref', 7], 3]]]") + "def pairs():\n    return {}\n",
        0.0,
        "AssertionError",
    ),
    "keys_of_its_own_counted": Payload(
        ["d = pairs()\nassert len(d) == 2 and sorted(d.values()) == [3, 4]"],
        "class P:\n    pass\ndef pairs():\n    return {P(): 3, P(): 4}\n",
        1.0,
    ),
}

CLASSES = {"errors": ERRORS}


def _meta(tests: Any) -> dict[str, Any]:
    if isinstance(tests, dict) and "unit_tests" in tests:
        return dict(tests)
    return {"tests": tests}


async def _score(env: Environment, payload: Payload) -> tuple[float | None, dict[str, Any]]:
    meta = _meta(payload.tests)
    try:
        got = await check(env, task(None, verifier_metadata=meta), answer(f"```python\n{payload.code}```"))
    except BadTask as exc:
        return None, {"reason": str(exc)}
    return got.reward, got.details


@pytest.mark.parametrize("klass", list(CLASSES))
async def test_each_payload_scores_as_one_interpreter_would(env: Environment, klass: str) -> None:
    wrong = []
    for name, payload in CLASSES[klass].items():
        got, details = await _score(env, payload)
        reason = str(details.get("reason", "")) + str(details.get("cases", ""))
        if got != payload.want or (payload.why and payload.why not in reason):
            wrong.append(f"{name}: got {got}, want {payload.want}: {reason[:400]}")
    assert not wrong, "\n".join(wrong)


def test_the_suite_holds_enough_payloads() -> None:
    assert sum(map(len, CLASSES.values())) >= 9
