"""reasoning-gym rows and rewards both ways with NeMo Gym (0.4.0's and 0.7.0's
resources_servers/reasoning_gym, fetched by the nemo_gym_servers fixtures): its example rows score
in the `reasoning_gym` environment exactly as NeMo Gym recorded them, and the rows `rollmesh
datasets generate` writes carry every field, of the same type, that NeMo Gym's rows and its verify
request have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh.responses_items import response_messages
from rollmesh.procedural import GeneratorSpec
from rollmesh.procedural import ProceduralSpec
from rollmesh.procedural.rows import generate_rows
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import Response
from rollmesh.verifier import Task
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env

ENV = BUILTIN_ROOT / "environments" / "reasoning_gym"


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("reading", ["final", "nemo_gym"])
async def test_nemo_gyms_recorded_rollouts_score_the_same_here(
    nemo_gym_servers_each: Path, reading: str
) -> None:
    """Each version's recorded rollouts, read as rollmesh reads an answer (the final message,
    outside think blocks) and as NeMo Gym's server does (the option): the same rewards, since they
    hold one assistant message without think tags (their reasoning is a separate output item)."""
    data = nemo_gym_servers_each / "reasoning_gym" / "data"
    rows = {r["question"]: r for r in jsonl(data / "example.jsonl")}
    rollouts = jsonl(data / "example_rollouts.jsonl")
    assert len(rollouts) == 5 and {float(r["reward"]) for r in rollouts} == {0.0, 1.0}
    async with load_env(ENV) as env:
        for rollout in rollouts:
            row = rows[rollout["responses_create_params"]["input"][-1]["content"]]
            task = Task({**row, "verifier_metadata": {"answer_reading": reading}})
            response = Response(tuple(response_messages(rollout["response"])))
            got = await check(env, task, response)
            assert got.reward == float(rollout["reward"]), (row["question"][:60], got)
            assert got.extracted_answer == str(rollout["extracted_answer"]).strip()


def test_generated_rows_have_nemo_gyms_fields_and_types(nemo_gym_servers: Path) -> None:
    theirs = jsonl(nemo_gym_servers / "reasoning_gym" / "data" / "example.jsonl")[0]
    spec = ProceduralSpec((GeneratorSpec("knights_knaves"),), size=2, seed=0)
    for ours in generate_rows(spec):
        assert set(theirs) <= set(ours)
        for key, value in theirs.items():
            assert type(ours[key]) is type(value), key
        assert ours["responses_create_params"]["input"] == [{"role": "user", "content": ours["question"]}]
        assert ours["metadata"]["source_dataset"] == "knights_knaves"
        assert set(theirs["metadata"]) <= set(ours["metadata"])
