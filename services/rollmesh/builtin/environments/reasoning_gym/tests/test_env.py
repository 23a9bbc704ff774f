"""reasoning_gym: the generator's own scorer in a worker process, on the shipped example rows."""

import json
from pathlib import Path
from typing import Any

import pytest

from rollmesh.verifier import BadTask
from rollmesh.verifier import Message
from rollmesh.verifier import Response
from rollmesh.verifier import Task
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env

HERE = Path(__file__).resolve().parent.parent
ROWS = [json.loads(line) for line in (HERE / "data" / "example.jsonl").read_text().splitlines()]


def first(generator: str) -> dict[str, Any]:
    return next(r for r in ROWS if r["metadata"]["source_dataset"] == generator)


async def test_right_wrong_empty_raising_and_rebuilt() -> None:
    arith, factors, grid = first("chain_sum"), first("prime_factorization"), first("rearc")
    async with load_env(HERE) as env:
        right = await check(env, Task(arith), answer(f"So the sum is <answer>{arith['answer']}</answer>"))
        assert (right.reward, right.extracted_answer) == (1.0, arith["answer"])
        assert right.details == {"reason": "scored by chain_sum", "generator": "chain_sum"}
        boxed = await check(env, Task(arith), answer(f"\\boxed{{{arith['answer']}}}"))  # NeMo Gym's fallback
        assert boxed.reward == 1.0
        bare = await check(env, Task(arith), answer(str(arith["answer"])))  # neither: the whole text
        assert bare.reward == 1.0
        wrong = await check(env, Task(arith), answer("<answer>-1</answer>"))
        assert (wrong.reward, wrong.extracted_answer) == (0.0, "-1")
        empty = await check(env, Task(arith), answer("  "))
        assert (empty.reward, empty.details["reason"]) == (0.0, "empty response")
        # prime_factorization's scorer raises ValueError on a non-numeric factor: a wrong answer.
        raised = await check(env, Task(factors), answer("<answer>two times three</answer>"))
        assert raised.reward == 0.0 and raised.details["reason"].startswith("scorer raised ValueError")
        # rearc's entry is made again from (generator, config, index): its gold scores 1.0, which
        # its stored metadata (tuples turned into lists by JSON) would score 0.05.
        rebuilt = await check(env, Task(grid), answer(f"<answer>{grid['answer']}</answer>"))
        assert rebuilt.reward == 1.0
        # Only the final assistant message is read; NeMo Gym's reading (an option) joins them all.
        turns = Response(
            (Message("assistant", f"<answer>{arith['answer']}</answer>"), Message("assistant", "never mind"))
        )
        assert (await check(env, Task(arith), turns)).reward == 0.0
        joined = Task({**arith, "verifier_metadata": {"answer_reading": "nemo_gym"}})
        assert (await check(env, joined, turns)).reward == 1.0


async def test_rows_that_cannot_be_scored_are_bad_tasks_never_a_0() -> None:
    grid = first("rearc")
    stale = {k: v for k, v in grid.items() if k != "reasoning_gym_entry"}
    edited = {**grid, "question": "something else"}
    async with load_env(HERE) as env:
        with pytest.raises(BadTask, match="names no generator"):
            await check(env, Task({"question": "q", "answer": "1"}), answer("<answer>1</answer>"))
        with pytest.raises(BadTask, match="names no generator"):  # metadata not an object
            await check(env, Task({"question": "q", "metadata": ["chain_sum"]}), answer("<answer>1</answer>"))
        with pytest.raises(BadTask, match="metadata must be an object"):
            row = {"question": "q", "metadata": "x", "reasoning_gym_entry": {"generator": "chain_sum"}}
            await check(env, Task(row), answer("<answer>1</answer>"))
        with pytest.raises(BadTask, match="has no generator 'no_such_task'"):
            row = {"question": "q", "answer": "1", "metadata": {"source_dataset": "no_such_task"}}
            await check(env, Task(row), answer("<answer>1</answer>"))
        with pytest.raises(BadTask, match="tuples"):
            await check(env, Task(stale), answer(f"<answer>{grid['answer']}</answer>"))
        with pytest.raises(BadTask, match="another question"):
            await check(env, Task(edited), answer(f"<answer>{grid['answer']}</answer>"))
