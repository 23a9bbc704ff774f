"""Generator specs: reading them, the rows they give (deterministic, NeMo Gym's shape), entries
made again from a row's record, and `rollmesh datasets generate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.procedural import GeneratorSpec
from rollmesh.procedural import InvalidGeneratorSpec
from rollmesh.procedural import ProceduralSpec
from rollmesh.procedural import UnknownGenerator
from rollmesh.procedural.rows import SOURCE_FIELD
from rollmesh.procedural.rows import generate_rows
from rollmesh.procedural.rows import rebuild_entry
from rollmesh.procedural.spec import parse_generator_arg

MIX = ProceduralSpec(
    (GeneratorSpec("basic_arithmetic", 2.0, {"max_terms": 2}), GeneratorSpec("chain_sum")), size=12, seed=5
)


def test_a_spec_reads_back_from_its_json_and_bad_ones_say_what_is_wrong() -> None:
    assert ProceduralSpec.from_json(json.loads(json.dumps(MIX.to_json()))) == MIX
    short = ProceduralSpec.from_json({"reasoning_gym": {"generators": ["leg_counting"], "size": 3}})
    assert short == ProceduralSpec((GeneratorSpec("leg_counting"),), 3, 0)
    assert parse_generator_arg("chain_sum:0.5") == GeneratorSpec("chain_sum", 0.5)
    prompted = ProceduralSpec(MIX.generators, 2, 5, system_prompt="direct")
    assert ProceduralSpec.from_json(prompted.to_json()) == prompted
    bad: list[tuple[Any, str]] = [
        ([], "must be a JSON object"),
        ({"generators": [], "size": 1}, "non-empty list"),
        ({"generators": ["a"], "size": 0}, "size must be"),
        ({"generators": ["a"], "size": True}, "must be an integer"),
        ({"generators": ["a"], "size": 1, "sed": 1}, "unknown key 'sed'"),
        ({"generators": [{"name": "a", "weight": -1}], "size": 1}, "positive number"),
        ({"generators": [{"name": "a", "config": []}], "size": 1}, "`config` must be an object"),
        ({"generators": ["a", "a"], "size": 1}, "named twice"),
        ({"generators": ["a"], "size": 1, "system_prompt": 3}, "must be a string"),
        ({"generators": [{"name": "a", "level": -1}], "size": 1}, "`level` must be an integer >= 0"),
    ]
    for data, message in bad:
        with pytest.raises(InvalidGeneratorSpec, match=message):
            ProceduralSpec.from_json(data)
    with pytest.raises(InvalidGeneratorSpec, match="must be a number"):
        parse_generator_arg("chain_sum:heavy")


def test_rows_are_nemo_gym_rows_the_same_for_the_same_seed_and_rebuild_from_their_record() -> None:
    rows = list(generate_rows(MIX))
    assert rows == list(generate_rows(MIX))
    assert rows != list(generate_rows(ProceduralSpec(MIX.generators, 12, seed=6)))
    assert {r["metadata"]["source_dataset"] for r in rows} == {"basic_arithmetic", "chain_sum"}
    for i, row in enumerate(rows):
        assert row["responses_create_params"]["input"] == [{"role": "user", "content": row["question"]}]
        assert row["agent_ref"]["name"] == "reasoning_gym_simple_agent"
        made = rebuild_entry(row[SOURCE_FIELD])  # a mixture's row from its own generator's config
        assert (made["question"], made["answer"]) == (row["question"], row["answer"])
        assert row["task_id"] == f"{row['metadata']['source_dataset']}/{i}"
    arith = next(r for r in rows if r["metadata"]["source_dataset"] == "basic_arithmetic")
    assert arith[SOURCE_FIELD]["config"] == {"size": 12, "seed": 6, "max_terms": 2}  # composite: seed + 1
    direct = next(generate_rows(ProceduralSpec(MIX.generators, 1, 5, system_prompt="direct")))
    system, user = direct["responses_create_params"]["input"]
    assert (
        system["role"] == "system"
        and "<answer>" in system["content"]
        and user["content"] == rows[0]["question"]
    )
    own = next(generate_rows(ProceduralSpec(MIX.generators, 1, 5, system_prompt="Be brief.")))
    assert own["responses_create_params"]["input"][0] == {"role": "system", "content": "Be brief."}
    with pytest.raises(UnknownGenerator, match="did you mean chain_sum"):
        list(generate_rows(ProceduralSpec((GeneratorSpec("chain_sums"),), 1)))
    with pytest.raises(InvalidGeneratorSpec, match="unexpected keyword argument 'bogus'"):
        list(generate_rows(ProceduralSpec((GeneratorSpec("chain_sum", 1.0, {"bogus": 1}),), 1)))


def test_datasets_generate_writes_rows_or_the_spec(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "mix.jsonl"
    args = [
        "datasets",
        "generate",
        "-g",
        "basic_arithmetic:2",
        "-g",
        "chain_sum",
        "-c",
        'basic_arithmetic={"max_terms": 2}',
    ]
    done = runner.invoke(build_app(), [*args, "-n", "12", "--seed", "5", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert [json.loads(line) for line in out.read_text().splitlines()] == list(generate_rows(MIX))
    spec_file = tmp_path / "mix.json"
    done = runner.invoke(build_app(), [*args, "-n", "12", "--seed", "5", "--spec-only", "-o", str(spec_file)])
    assert done.exit_code == 0 and ProceduralSpec.from_json(json.loads(spec_file.read_text())) == MIX
    again = runner.invoke(build_app(), ["datasets", "generate", "--spec", str(spec_file), "-n", "3"])
    three = ProceduralSpec(MIX.generators, 3, MIX.seed)  # --size overrides the file's
    assert [json.loads(line) for line in again.stdout.splitlines()] == list(generate_rows(three))
    refused = runner.invoke(build_app(), ["datasets", "generate", "-g", "nope_not_one"])
    assert refused.exit_code == 2 and "UNKNOWN_GENERATOR" in refused.output


def test_a_curriculum_level_is_a_config_recorded_whole_and_rising_levels_are_harder() -> None:
    """`level` resolves through reasoning-gym's curriculum into the config the rows record, so an
    entry is made again from its record alone; a higher level widens the curriculum's ranges."""
    easy = ProceduralSpec((GeneratorSpec("chain_sum", 1.0, {"allow_negation": False}, 0),), 20, 3)
    assert ProceduralSpec.from_json(easy.to_json()) == easy and easy.at_level(4).generators[0].level == 4
    terms = {}
    for level in (0, 4):
        rows = list(generate_rows(easy.at_level(level)))
        config = rows[0][SOURCE_FIELD]["config"]
        assert config["allow_negation"] is False and (config["size"], config["seed"]) == (20, 3)
        for row in rows[:3]:
            assert rebuild_entry(row[SOURCE_FIELD])["question"] == row["question"]
        terms[level] = (config["max_terms"], max(r["metadata"]["num_terms"] for r in rows))
    assert terms[0] == (2, 2) and terms[4][0] > 2 and terms[4][1] > 2
    with pytest.raises(InvalidGeneratorSpec, match="has no curriculum"):
        list(generate_rows(ProceduralSpec((GeneratorSpec("acre", level=1),), 1)))
    leveled = CliRunner().invoke(
        build_app(), ["datasets", "generate", "-g", "chain_sum", "--level", "4", "-n", "2"]
    )
    assert (
        leveled.exit_code == 0
        and json.loads(leveled.stdout.splitlines()[0])[SOURCE_FIELD]["config"]["max_terms"] == terms[4][0]
    )
