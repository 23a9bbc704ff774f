"""single_tool_call: call get_weather and answer with its output."""

from pathlib import Path

from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import call
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import rows
from rollmesh.verifier.testing import seeded
from rollmesh.verifier.testing import task
from rollmesh.verifier.testing import with_tool_turn

HERE = Path(__file__).resolve().parent.parent
PARIS = {"city": "Paris"}


async def test_right_answer_after_calling_the_tool() -> None:
    async with load_env(HERE) as env:
        t = task(None, "Weather in Paris?", verifier_metadata=PARIS)
        session = await seeded(env, t)
        out = await env.call_tool(session, call("get_weather", {"city": "paris"}))
        assert (out.output, out.is_error) == ("light rain, 12°C", False)
        r = await check(
            env, t, with_tool_turn(call("get_weather", {"city": "Paris"}), out.output, f"It is {out.output}.")
        )
        assert r.reward == 1.0 and r.components == {"called_tool": 1.0, "answered_with_output": 1.0}


async def test_wrong_answers() -> None:
    async with load_env(HERE) as env:
        t = task(None, "Weather in Paris?", verifier_metadata=PARIS)
        no_call = await check(env, t, answer("light rain, 12°C"))
        assert no_call.reward == 0.0 and no_call.details["reason"] == "get_weather was not called"
        wrong_text = await check(
            env, t, with_tool_turn(call("get_weather", PARIS), "light rain, 12°C", "It's sunny!")
        )
        assert wrong_text.reward == 0.0 and wrong_text.components["called_tool"] == 1.0
        wrong_city = await check(
            env, t, with_tool_turn(call("get_weather", {"city": "Tokyo"}), "sunny, 24°C", "sunny, 24°C")
        )
        assert wrong_city.reward == 0.0
        empty = await check(env, t, answer(""))
        assert empty.reward == 0.0
        malformed = await check(
            env, t, with_tool_turn(call("get_weather", "{not json"), "", "light rain, 12°C")
        )
        assert malformed.reward == 0.0


async def test_bad_tool_arguments_are_error_outputs() -> None:
    async with load_env(HERE) as env:
        session = await seeded(env, task(None))
        for args, needle in [
            ("{oops", "not valid JSON"),
            ({}, "arguments.city is required"),
            ({"city": 3}, "must be string"),
            ({"city": "Paris", "units": "C"}, "not a known parameter"),
            ({"city": "Atlantis"}, "no weather data"),
        ]:
            out = await env.call_tool(session, call("get_weather", args))
            assert out.is_error and needle in out.output, (args, out)


async def test_example_rows_have_the_tool() -> None:
    data = rows(HERE)
    assert 5 <= len(data) <= 20
    assert all(r["responses_create_params"]["tools"][0]["name"] == "get_weather" for r in data)
