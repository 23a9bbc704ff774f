"""math: math-verify in a worker process with a hard timeout."""

import time
from dataclasses import replace
from pathlib import Path

import pytest

from rollmesh.verifier import BadTask
from rollmesh.verifier import CheckFailed
from rollmesh.verifier.errors import WorkerError
from rollmesh.verifier.loader import import_file
from rollmesh.verifier.testing import TEST_CONFIG
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import rows
from rollmesh.verifier.testing import task

HERE = Path(__file__).resolve().parent.parent


async def test_right_wrong_empty_malformed() -> None:
    async with load_env(HERE) as env:
        right = await check(env, task("\\frac{5}{6}"), answer("Adding gives \\boxed{\\frac{5}{6}}."))
        assert right.reward == 1.0 and right.components["symbolic"] == 1.0
        assert right.extracted_answer == "\\frac{5}{6}"
        equiv = await check(env, task("0.5"), answer("The answer is $\\frac{1}{2}$"))
        assert equiv.reward == 1.0
        wrong = await check(env, task("4"), answer("x = \\boxed{5}"))
        assert wrong.reward == 0.0 and wrong.extracted_answer == "5"
        empty = await check(env, task("4"), answer("   "))
        assert (empty.reward, empty.details["reason"]) == (0.0, "empty response")
        garbage = await check(env, task("4"), answer("\\boxed{{{ \\frac"))
        assert garbage.reward == 0.0
        with pytest.raises(BadTask, match="expected_answer"):  # an error, never a reward of 0
            await check(env, task(None), answer("\\boxed{4}"))
        for odd in ({"a": 1}, [1], True, float("nan")):  # parsed as an expression no answer equals
            with pytest.raises(BadTask, match="expected_answer must be a string or a number"):
                await check(env, task(odd), answer("\\boxed{1}"))
        assert (await check(env, task(1.5), answer("\\boxed{3/2}"))).reward == 1.0  # a number is one


def test_a_slow_comparison_is_judged_not_timed_out_into_a_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """math-verify's own 5 s timeouts answered "not equivalent" when a comparison ran long (a
    loaded host): a correct answer scored 0. They are off; only the worker's hard timeout (the
    next test) bounds a check. Here one comparison takes 6 s and the answer is still right."""
    import math_verify.grader as grader

    real = grader.sympy_expr_eq

    def slow(*args: object, **kwargs: object) -> bool:
        time.sleep(6.0)
        return bool(real(*args, **kwargs))

    monkeypatch.setattr(grader, "sympy_expr_eq", slow)
    env_module = import_file(HERE / "env.py")
    assert env_module.check("5", "so \\boxed{\\frac{10}{2}}")["correct"] is True


async def test_a_check_that_times_out_twice_scores_0_with_a_reason() -> None:
    """A check that overruns the timeout is tried once more on a fresh worker (a loaded host), then
    scores 0 with the reason (issue 27: as CHECK_TIMEOUT, retried, a 19-character answer traded a 0
    for a dropped sample). Here every check overruns."""
    cfg = replace(TEST_CONFIG, math_timeout_s=0.001)
    async with load_env(HERE, cfg) as env:
        await env.context.workers.warm()
        r = await check(env, task("\\frac{5}{6}"), answer("\\boxed{\\frac{10}{12}}"))
        assert (r.reward, r.details["timed_out"]) == (0.0, True), r
        assert "longer than 0.001s twice" in r.details["reason"]
        assert env.context.workers.restarts >= 2


async def test_a_checker_that_dies_is_an_error_never_a_reward_of_0() -> None:
    async with load_env(HERE) as env:
        await env.context.workers.warm()

        async def dying(*args: object, **kwargs: object) -> object:
            raise WorkerError("math-verify worker died (exit code -9)")

        env.context.workers.call = dying  # type: ignore[method-assign]
        with pytest.raises(CheckFailed, match="worker died"):
            await check(env, task("4"), answer("\\boxed{4}"))


async def test_example_rows() -> None:
    data = rows(HERE)
    assert 5 <= len(data) <= 20
    async with load_env(HERE) as env:
        for row in data:
            r = await check(env, task(row["expected_answer"]), answer(f"\\boxed{{{row['expected_answer']}}}"))
            assert r.reward == 1.0, row


async def test_an_answer_too_large_to_check_is_not_sent_to_the_judge() -> None:
    """The judge is a second opinion on answers the symbolic check rejected; a value too large for
    math-verify is decided exactly (here: its magnitude differs), scores 0 with its reason, and no
    judge is asked (a gateway is not needed)."""
    async with load_env(HERE) as env:
        r = await check(
            env, task("5", verifier_metadata={"use_judge": True}), answer("\\boxed{10^{10^{10}}}")
        )
        assert r.reward == 0.0 and "too large" in r.details["reason"] and "judge" not in r.components
