"""The built-in `code` environment on NeMo Gym's code rows as they are (`verifier_metadata.unit_tests
{inputs, outputs[, fn_name]}`, LiveCodeBench's format; builtin/environments/code/unit_tests.py), and
on NeMo Gym's own recorded code_gen rollouts (0.4.0, via the nemo_gym_servers fixture)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rollmesh.builtin.environments.code.unit_tests import unit_tests_spec
from rollmesh.mesh import responses_items
from rollmesh.mesh.chat import content_text
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.verifier import BadTask
from rollmesh.verifier.environment import Response
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import task

CODE = BUILTIN_ROOT / "environments" / "code"

TWO_SUM = {
    "inputs": ["[2, 7, 11, 15]\n9", "[3, 2, 4]\n6"],
    "outputs": ["[0, 1]", "[1, 2]"],
    "fn_name": "twoSum",
}
SOLUTION = """```python
class Solution:
    def twoSum(self, nums, target):
        seen = {}
        for i, n in enumerate(nums):
            if target - n in seen:
                return [seen[target - n], i]
            seen[n] = i
```"""


def test_function_call_cases_become_asserts_and_stdin_cases_io() -> None:
    spec = unit_tests_spec(TWO_SUM)
    assert not isinstance(spec, str) and spec.kind == "asserts"
    assert spec.cases == [
        "assert Solution().twoSum([2, 7, 11, 15], 9) == [0, 1]",
        "assert Solution().twoSum([3, 2, 4], 6) == [1, 2]",
    ]
    floats = unit_tests_spec({"inputs": ['"x"'], "outputs": ["0.5"], "fn_name": "f"})
    assert not isinstance(floats, str)
    assert floats.cases == [
        "import math\nassert math.isclose(Solution().f('x'), 0.5, rel_tol=1e-05, abs_tol=1e-08)"
    ]
    io = unit_tests_spec({"inputs": ["1 2\n"], "outputs": ["3\n"], "fn_name": None})
    assert not isinstance(io, str) and (io.kind, io.cases) == ("io", [{"input": "1 2\n", "output": "3\n"}])


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ({"inputs": ["1"], "outputs": []}, "non-empty lists of equal length"),
        ({"inputs": [1], "outputs": ["1"]}, "inputs.0. must be a string"),
        ({"inputs": ["[1"], "outputs": ["1"], "fn_name": "f"}, "case 0: not JSON"),
        ({"inputs": ["NaN"], "outputs": ["1"], "fn_name": "f"}, "no Python literal"),
        ({"inputs": ["1"], "outputs": ["1"], "fn_name": "f()"}, "must be a Python identifier"),
        ([], "must be an object"),
    ],
)
def test_unit_tests_no_answer_could_pass_are_named(raw: Any, why: str) -> None:
    said = unit_tests_spec(raw)
    assert isinstance(said, str)
    assert re.search(why, said), said


async def test_the_code_environment_runs_unit_tests_both_styles() -> None:
    stdin = {"unit_tests": {"inputs": ["2 3\n", "10 -4\n"], "outputs": ["5\n", "6\n"]}}
    add = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    async with load_env(CODE) as env:
        assert (await check(env, task(None, verifier_metadata=stdin), answer(add))).reward == 1.0
        wrong = await check(env, task(None, verifier_metadata=stdin), answer(add.replace("a + b", "a - b")))
        assert wrong.reward == 0.0
        calls = {"unit_tests": TWO_SUM}
        assert (await check(env, task(None, verifier_metadata=calls), answer(SOLUTION))).reward == 1.0
        off = await check(env, task(None, verifier_metadata=calls), answer(SOLUTION.replace("i]", "i + 1]")))
        assert off.reward == 0.0
        with pytest.raises(BadTask, match=r"unit_tests\.inputs and \.outputs"):
            await check(env, task(None, verifier_metadata={"unit_tests": {"inputs": []}}), answer(add))


def _input_key(row: dict[str, Any]) -> str:
    """A row's input messages as (role, text): recorded rollouts hold them materialized (a `type`
    added, nulls), so they are joined to the dataset's rows by these, not by line (NeMo Gym writes
    rollouts in completion order)."""
    return json.dumps(
        [(m.get("role"), content_text(m.get("content"))) for m in row["responses_create_params"]["input"]]
    )


async def test_nemo_gym_code_gen_rollouts_score_as_nemo_gym_recorded_them(nemo_gym_servers: Path) -> None:
    """code_gen's recorded rollouts hold no unit tests: each is joined to its example.jsonl row. Then
    the `code` environment, given the recorded response (its output_text, what code_gen reads), gives
    the reward NeMo Gym recorded, row by row."""
    data = nemo_gym_servers / "code_gen" / "data"
    tasks = {_input_key(r): r for r in map(json.loads, (data / "example.jsonl").read_text().splitlines())}
    rollouts = [json.loads(line) for line in (data / "example_rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 5
    got, recorded = [], []
    async with load_env(CODE) as env:
        for rollout in rollouts:
            row = tasks[_input_key(rollout)]
            text = responses_items.output_text(rollout["response"]["output"])
            verdict = await check(
                env, task(None, verifier_metadata=row["verifier_metadata"]), Response.from_text(text)
            )
            got.append(verdict.reward)
            recorded.append(rollout["reward"])
    assert got == recorded and sorted(recorded) == [0.0, 0.0, 0.0, 0.0, 1.0]
