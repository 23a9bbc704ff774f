"""session_state: a per-session counter."""

from pathlib import Path

import pytest

from rollmesh.verifier import BadTask
from rollmesh.verifier import SessionRequired
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import call
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import rows
from rollmesh.verifier.testing import seeded
from rollmesh.verifier.testing import task

HERE = Path(__file__).resolve().parent.parent


async def test_right_answer_reaches_the_count() -> None:
    async with load_env(HERE) as env:
        t = task(5, verifier_metadata={"initial_value": 2})
        s = await seeded(env, t)
        assert (await env.call_tool(s, call("increment_counter", {"count": 3}))).output == "5"
        assert (await env.call_tool(s, call("get_counter_value", {}))).output == "5"
        r = await check(env, t, answer("5"), s)
        assert (r.reward, r.extracted_answer) == (1.0, "5")


async def test_wrong_empty_and_sessionless() -> None:
    async with load_env(HERE) as env:
        t = task(5, verifier_metadata={"initial_value": 2})
        s = await seeded(env, t)
        await env.call_tool(s, call("increment_counter", {"count": 1}))
        assert (await check(env, t, answer("5"), s)).reward == 0.0
        assert (await check(env, t, answer(""), s)).reward == 0.0
        with pytest.raises(SessionRequired):  # nothing to judge: an error, never a reward of 0
            await check(env, t, answer("5"), None)
        with pytest.raises(BadTask, match="initial_value"):
            await seeded(env, task(5, verifier_metadata={"initial_value": "two"}))
        malformed = task("five", verifier_metadata={"initial_value": 2})
        with pytest.raises(BadTask, match="expected_answer"):  # an error, never a reward of 0
            await check(env, malformed, answer("5"), await seeded(env, malformed))


async def test_sessions_are_isolated() -> None:
    async with load_env(HERE) as env:
        a = await seeded(env, task(1, verifier_metadata={"initial_value": 0}), "a")
        b = await seeded(env, task(1, verifier_metadata={"initial_value": 100}), "b")
        await env.call_tool(a, call("increment_counter", {"count": 1}))
        assert (await env.call_tool(b, call("get_counter_value", {}))).output == "100"
        assert (await env.call_tool(a, call("get_counter_value", {}))).output == "1"


async def test_bad_arguments() -> None:
    async with load_env(HERE) as env:
        s = await seeded(env, task(1))
        bad = await env.call_tool(s, call("increment_counter", {"count": "one"}))
        assert bad.is_error and "must be integer" in bad.output
        bad_bool = await env.call_tool(s, call("increment_counter", {"count": True}))
        assert bad_bool.is_error
        assert (await env.call_tool(s, call("get_counter_value", {}))).output == "0"


async def test_example_rows() -> None:
    data = rows(HERE)
    assert 5 <= len(data) <= 20
    assert all("initial_value" in r["verifier_metadata"] for r in data)
