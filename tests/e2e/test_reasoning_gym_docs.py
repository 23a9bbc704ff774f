"""docs/reasoning-gym.md's command blocks, run as written: datasets generated (and regenerated from
their spec, byte for byte), a mixture of ten generators run end to end with the fake model and
profiled per generator, and (slow: Ray Serve + vLLM on CPU) the shipped benchmark with the tiny
model."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block

DOC = DOCS / "reasoning-gym.md"
MIX10 = {
    "basic_arithmetic",
    "chain_sum",
    "leg_counting",
    "gcd",
    "lcm",
    "prime_factorization",
    "letter_counting",
    "spell_backward",
    "count_bits",
    "simple_equations",
}


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_the_generate_commands_run_as_written(tmp_path: Path) -> None:
    done = run_block(bash_block("## Generate a dataset", DOC), {}, tmp_path, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json_lines((tmp_path / "mix.jsonl").read_text())
    counts = collections.Counter(r["metadata"]["source_dataset"] for r in rows)
    assert len(rows) == 50 and set(counts) == {"basic_arithmetic", "chain_sum", "leg_counting"}
    assert counts["basic_arithmetic"] > counts["leg_counting"]  # weight 2 against 1
    arith = json_lines((tmp_path / "arith.jsonl").read_text())
    assert len(arith) == 20 and all(r["metadata"]["num_terms"] <= 2 for r in arith)
    spec = json.loads((tmp_path / "mix.json").read_text())["reasoning_gym"]
    assert (spec["size"], spec["seed"], len(spec["generators"])) == (50, 1, 3)


def test_a_mixture_of_ten_generators_runs_end_to_end_with_per_generator_metrics(tmp_path: Path) -> None:
    script = bash_block("## Run a mixture and read per-generator metrics", DOC)
    done = run_block(script, {}, tmp_path, cwd=tmp_path, timeout_s=600)
    assert done.returncode == 0, done.stderr[-4000:]
    groups = {g["group"]: g for g in json_lines(done.stdout)}
    assert set(groups) == MIX10
    assert sum(g["num_tasks"] for g in groups.values()) == 100
    assert sum(g["num_rollouts"] for g in groups.values()) == 200  # 100 rows x 2 repeats, none failed
    assert all(set(g["pass_at_k"]) == {"1", "2"} for g in groups.values())
    rows = json_lines((tmp_path / "runs" / "mix10" / "rollouts.jsonl").read_text())
    # The fake model repeats the question: scored by each generator, nothing is a pass.
    assert all(r["reward"] < 1.0 for r in rows) and len(rows) == 200


@pytest.mark.slow
def test_the_shipped_benchmark_runs_with_the_tiny_model(tmp_path: Path) -> None:
    done = run_block(bash_block("## The shipped benchmark", DOC), {}, tmp_path, cwd=tmp_path, timeout_s=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    groups = {g["group"]: g for g in json_lines(done.stdout)}
    assert set(groups) == {"basic_arithmetic", "chain_sum"}
    assert sum(g["num_rollouts"] for g in groups.values()) == 40 * 8
    assert all(set(g["pass_at_k"]) == {"1", "2", "4", "8"} for g in groups.values())


def test_the_curriculum_commands_run_as_written(tmp_path: Path) -> None:
    done = run_block(bash_block("## Curricula", DOC), {}, tmp_path, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json_lines(done.stdout)
    assert len(rows) == 6
    easy, hard = rows[:3], rows[3:]
    assert all(r["metadata"]["num_terms"] == 2 for r in easy)
    assert hard[0]["reasoning_gym_entry"]["config"]["max_terms"] > 2
