"""code: the answer's Python runs against the task's tests in the sandbox."""

import time
from pathlib import Path

import pytest

from rollmesh.verifier import BadTask
from rollmesh.verifier.loader import import_file
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import rows
from rollmesh.verifier.testing import task

HERE = Path(__file__).resolve().parent.parent
ADD_TESTS = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}


async def test_right_answer_in_a_fence() -> None:
    async with load_env(HERE) as env:
        r = await check(
            env,
            task(None, verifier_metadata=ADD_TESTS),
            answer("Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."),
        )
        assert r.reward == 1.0, r.details
        assert r.components == {"pass_rate": 1.0, "all_passed": 1.0}
        assert r.extracted_answer.startswith("def add")


async def test_wrong_answer_and_partial_credit() -> None:
    async with load_env(HERE) as env:
        code = "def add(a, b):\n    return 3"
        r = await check(env, task(None, verifier_metadata=ADD_TESTS), answer(code))
        assert r.reward == 0.0 and r.components["pass_rate"] == 0.5
        partial = await check(
            env, task(None, verifier_metadata={**ADD_TESTS, "partial_credit": True}), answer(code)
        )
        assert partial.reward == 0.5


async def test_empty_malformed_and_bad_tests() -> None:
    async with load_env(HERE) as env:
        empty = await check(env, task(None, verifier_metadata=ADD_TESTS), answer(""))
        assert (empty.reward, empty.details["reason"]) == (0.0, "empty response")
        syntax = await check(env, task(None, verifier_metadata=ADD_TESTS), answer("def add(:"))
        assert syntax.reward == 0.0 and "SyntaxError" in syntax.details["reason"]
        # Tests no answer could pass are an error (BAD_TASK), never a reward of 0.
        with pytest.raises(BadTask, match=r"verifier_metadata has no tests.*--tasks"):
            await check(env, task(None), answer("x = 1"))
        with pytest.raises(BadTask, match=r"verifier_metadata\.tests must be"):
            await check(env, task(None, verifier_metadata={"tests": 3}), answer("x = 1"))
        unusable = {
            "assert add(1, 2) == 3 +": "does not parse",
            # HumanEval's check(candidate) that the tests never call: no assert can run
            "def check(candidate):\n    assert candidate(1, 2) == 3\n": "no assertion ran",
        }
        for case, why in unusable.items():
            meta = {"tests": ["assert add(1, 2) == 3", case]}
            with pytest.raises(BadTask, match=rf"tests.*{why}"):
                await check(
                    env, task(None, verifier_metadata=meta), answer("def add(a, b):\n    return a + b")
                )


async def test_any_python_in_a_test_is_verified() -> None:
    """Asserts inside a while, a try, a helper taking *args: once refused as unverifiable (their
    asserts would have run in the solution's process), they run in the clean interpreter now."""
    shapes = [
        "i = 0\nwhile i < 2:\n    assert add(i, 0) == i\n    i += 1",
        "if True:\n    try:\n        assert add(1, 1) == 2\n    except ZeroDivisionError:\n        pass",
        "def check(*fs):\n    assert fs[0](1, 2) == 3\ncheck(add)",
    ]
    async with load_env(HERE) as env:
        for code, want in (
            ("def add(a, b):\n    return a + b", 1.0),
            ("def add(a, b):\n    return a * b", 0.0),
        ):
            r = await check(env, task(None, verifier_metadata={"tests": shapes}), answer(code))
            assert r.reward == want, r.details


async def test_stdin_stdout_tests() -> None:
    meta = {"tests": {"inputs": ["3 4\n", "2 5\n"], "outputs": ["12\n", "10\n"]}}
    async with load_env(HERE) as env:
        good = "a, b = map(int, input().split())\nprint(a * b)"
        assert (await check(env, task(None, verifier_metadata=meta), answer(good))).reward == 1.0
        bad = "a, b = map(int, input().split())\nprint(a + b)"
        assert (await check(env, task(None, verifier_metadata=meta), answer(bad))).reward == 0.0


def test_code_extraction_is_one_pass() -> None:
    """extract_code runs on the verifier's event loop: a long run of blanks after a fence (seconds
    with the backtracking pattern) is read at once, and fences still extract as before."""
    extract_code = import_file(HERE / "env.py").extract_code
    for text in ("```" + " " * 100_000, ("```" + " \t" * 500) * 100):
        started = time.monotonic()
        assert extract_code(text) == text
        assert time.monotonic() - started < 1.0  # generous (a loaded host); it was ~40 s
    assert extract_code("```  Python3  \nx = 1\n```") == "x = 1\n"
    assert extract_code("```py\na\n```\n```\nb\n```") == "a\n"
    assert extract_code("```\na\n```\n```\nb\n```") == "b\n"


async def test_example_rows_have_tests() -> None:
    data = rows(HERE)
    assert 5 <= len(data) <= 20
    assert all(row["verifier_metadata"]["tests"] for row in data)
