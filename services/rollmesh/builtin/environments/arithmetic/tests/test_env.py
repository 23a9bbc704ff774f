"""arithmetic: the last number of the last assistant message, read whole, is the answer."""

import time
from pathlib import Path

import pytest

from rollmesh.verifier import BadTask
from rollmesh.verifier.environment import Message
from rollmesh.verifier.environment import Response
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import rows
from rollmesh.verifier.testing import task

HERE = Path(__file__).resolve().parent.parent


async def test_right_answer_scores_one() -> None:
    async with load_env(HERE) as env:
        r = await check(env, task("68", "What is 30 + 38?"), answer("The answer is 68."))
        assert (r.reward, r.extracted_answer, r.components) == (1.0, "68", {"correct": 1.0})


async def test_wrong_answer_and_last_integer_rule() -> None:
    async with load_env(HERE) as env:
        wrong = await check(env, task("68", "What is 30 + 38?"), answer("30 + 38 = 68, no wait, 67"))
        assert (wrong.reward, wrong.extracted_answer) == (0.0, "67")
        negative = await check(env, task("-3"), answer("It is -3"))
        assert negative.reward == 1.0


# A wrong answer never matches through a fragment of itself, a look-alike sign or a huge exponent.
WRONG_LOOKALIKES = {
    "12.5": "5",  # decimal part
    "5e3": "3",  # exponent
    "5e3 ": "5",
    "1/5": "5",  # fraction
    "10^5": "5",  # power
    "10 ** 5": "5",
    "5²": "5",
    "5,000": "0",  # thousands separator
    "v1.2.5": "5",
    "\u22125": "5",  # U+2212 MINUS SIGN
    "\uff0d5": "5",  # FULLWIDTH HYPHEN-MINUS
    "1e999999999": "1",  # not evaluated, not an integer answer
    "0.1e-1": "0",
    "1.234,5": "5",  # a European decimal comma is no number, not its last digits
}
RIGHT_FORMS = {
    "5.0": "5",
    "10/2": "5",
    "5e3": "5000",
    "5,000": "5000",
    "\u22125": "-5",
    "The answer is 7.": "7",
}


@pytest.mark.parametrize(("text", "expected"), sorted(WRONG_LOOKALIKES.items()))
async def test_a_wrong_number_never_matches_through_a_fragment(text: str, expected: str) -> None:
    async with load_env(HERE) as env:
        r = await check(env, task(expected), answer(text))
        assert r.reward == 0.0, (text, r)


@pytest.mark.parametrize(("text", "expected"), sorted(RIGHT_FORMS.items()))
async def test_the_whole_number_is_read(text: str, expected: str) -> None:
    async with load_env(HERE) as env:
        r = await check(env, task(expected), answer(text))
        assert (r.reward, r.extracted_answer) == (1.0, expected), (text, r)


async def test_hostile_answers_are_read_in_one_pass() -> None:
    """The check runs on the verifier's event loop: no answer may make it slow. A backtracking
    pattern took minutes on a run of thousands groups; each of these is read in milliseconds."""
    hostile = [
        "1" + ",000" * 5000 + "1",
        "1,000" * 4000,
        "1" * 20000,
        "1." * 10000,
        "1e" * 10000,
        "12/" * 7000,
        "-" * 20000 + "5",
        ("9" * 100 + "/") * 200,
        "1 " * 10000,
        "1\\," + "000\\," * 5000 + "0",
        "1{,}" * 7000,
        "√" * 10000 + "5",
        "5" + "!" * 20000,
    ]
    async with load_env(HERE) as env:
        for text in hostile:
            started = time.monotonic()
            await check(env, task("5"), answer(text))
            assert time.monotonic() - started < 2.0, text[:40]  # generous: a loaded host; it was minutes


async def test_a_last_number_that_is_not_an_integer_is_named() -> None:
    async with load_env(HERE) as env:
        half = await check(env, task("2"), answer("It is 2 or 2.5"))
        reason = "the last number is not an integer"
        assert (half.reward, half.extracted_answer, half.details["reason"]) == (0.0, "2.5", reason)


async def test_empty_and_malformed() -> None:
    async with load_env(HERE) as env:
        empty = await check(env, task("5"), answer(""))
        assert (empty.reward, empty.extracted_answer, empty.details["reason"]) == (0.0, "", "empty response")
        words = await check(env, task("5"), answer("five"))
        assert words.reward == 0.0 and words.details["reason"] == "no integer in the response"
        # A row that cannot be scored is an error (BAD_TASK), never a reward of 0.
        with pytest.raises(BadTask, match="expected_answer"):
            await check(env, task("not a number"), answer("5"))


async def test_only_the_last_assistant_message_counts() -> None:
    async with load_env(HERE) as env:
        resp = Response((Message("assistant", "68"), Message("user", "sure?"), Message("assistant", "70")))
        assert (await check(env, task("68"), resp)).reward == 0.0


async def test_example_rows_are_nemo_gym_shaped_and_solvable() -> None:
    data = rows(HERE)
    assert 5 <= len(data) <= 20
    async with load_env(HERE) as env:
        for row in data:
            t = task(row["expected_answer"], row["responses_create_params"]["input"][0]["content"])
            assert (await check(env, t, answer(f"The answer is {row['expected_answer']}."))).reward == 1.0
