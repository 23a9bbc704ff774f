"""examples/grpo_arith.py, short: 3 GRPO steps against an embedded mesh with the fake model engine.

The loop runs end to end (sink -> GRPO step -> checkpoint -> UpdateWeights -> held-out eval), the
policy version advances through the token records (with max staleness 1, step 3's rollouts come from
version >= 1), and it writes metrics.csv, metrics.png and summary.json. The training split it writes
shares no task with the held-out benchmark.
"""

from __future__ import annotations

import csv
import json
import shlex
import subprocess
import sys
from pathlib import Path

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "grpo_arith.py"
BENCHMARK_ROWS = ROOT / "services" / "rollmesh" / "builtin" / "datasets" / "arithmetic" / "test.jsonl"


def questions(path: Path) -> set[str]:
    return {json.loads(line)["responses_create_params"]["input"][0]["content"] for line in path.open()}


def test_grpo_example_runs_three_steps_and_versions_advance(tmp_path: Path) -> None:
    out = tmp_path / "grpo"
    args = ["--embedded", "--backend", "fake", "--steps", "3", "--groups", "2", "--group-size", "4"]
    args += ["--eval-every", "3", "--eval-limit", "2", "--max-staleness", "1", "--out", str(out)]
    args += ["--in-flight", "continue"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["steps"], summary["policy_version"]) == (3, 3)
    assert summary["pass_at_1_first"] is not None and summary["pass_at_1_last"] is not None
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["step"] for r in rows] == ["0", "1", "2", "3"]
    assert rows[0]["pass_at_1"] != "" and rows[3]["pass_at_1"] != ""  # held-out evals before and after
    oldest_at_step_3 = int(rows[3]["rollout_versions"].split("-")[0])
    assert oldest_at_step_3 >= 1, rows[3]
    assert all(float(r["update_s"]) >= 0 for r in rows[1:])
    assert (out / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0002", "step-0003"]
    assert 0 < summary["wall_s"] and summary["time_budget_s"] == 900.0
    # Partial rollouts throw no generated id away; what was trained on and dropped is counted.
    assert (summary["in_flight"], summary["discarded_tokens"]) == ("continue", 0)
    assert summary["wasted_tokens"] == summary["dropped_stale_tokens"] >= 0
    assert summary["trained_tokens"] == sum(int(r["tokens"]) for r in rows[1:]) > 0
    assert summary["steps_per_min"] > 0


def test_training_split_never_holds_a_benchmark_task(tmp_path: Path) -> None:
    """The held-out benchmark is never trained on: the example's training split (every a + b with
    a, b in 0..99 outside the held-out pairs) shares no question with the benchmark's 200 rows."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import runpy; m = runpy.run_path({str(EXAMPLE)!r}); "
            f"print(m['write_train_split'](__import__('pathlib').Path({str(tmp_path / 't.jsonl')!r}), 0))",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    train, benchmark = questions(tmp_path / "t.jsonl"), questions(BENCHMARK_ROWS)
    assert len(train) == int(done.stdout.strip()) > 8000 and len(benchmark) == 200
    assert not train & benchmark


def test_grpo_example_trains_on_a_reasoning_gym_mixture(tmp_path: Path) -> None:
    """--reasoning-gym: the same loop on a mixture of ten reasoning-gym generators, scored by the
    reasoning_gym environment; its training split holds none of the held-out spec's questions."""
    out = tmp_path / "grpo"
    # docs/reasoning-gym.md's command, made short: its later flags win
    command = shlex.split(
        bash_block("`examples/grpo_arith.py --reasoning-gym SPEC`", DOCS / "reasoning-gym.md")
    )
    assert command[:2] == ["python", "examples/grpo_arith.py"] and "reasoning_gym_mix10" in command, command
    args = [*command[2:], "--backend", "fake", "--steps", "2", "--groups", "2", "--group-size", "4"]
    args += ["--eval-every", "2", "--eval-limit", "3", "--out", str(out), "--rg-train-size", "60"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["steps"], summary["policy_version"]) == (2, 2)
    assert summary["pass_at_1_first"] is not None and summary["pass_at_1_last"] is not None
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["step"] for r in rows] == ["0", "1", "2"] and all(r["reward"] != "" for r in rows[1:])
    train = [json.loads(line) for line in (out / "train.jsonl").open()]
    spec = (
        ROOT / "services" / "rollmesh" / "builtin" / "datasets" / "reasoning_gym_mix10" / "reasoning_gym.json"
    )
    held_out = subprocess.run(
        [sys.executable, "-m", "rollmesh.cli", "datasets", "generate", "--spec", str(spec)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert held_out.returncode == 0, held_out.stderr[-3000:]
    asked = {json.loads(line)["question"] for line in held_out.stdout.splitlines()}
    assert 0 < len(train) <= 60 and len(asked) > 50
    assert not {r["question"] for r in train} & asked
    assert len({r["metadata"]["source_dataset"] for r in train}) == 10


def test_grpo_example_raises_the_curriculum_level_as_the_reward_reaches_the_bar(tmp_path: Path) -> None:
    """--rg-curriculum: training starts at curriculum level 0 and moves to a job one level up each
    time the last 5 steps' mean reward reaches the bar (0 here: every 5 steps), with a split per level."""
    out = tmp_path / "grpo"
    args = ["--embedded", "--backend", "fake", "--steps", "11", "--groups", "1", "--group-size", "2"]
    args += ["--eval-every", "0", "--out", str(out), "--reasoning-gym", "reasoning_gym_arith"]
    args += ["--rg-train-size", "40", "--rg-curriculum", "0"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["level"] for r in rows[1:]] == ["0"] * 5 + ["1"] * 5 + ["2"]
    assert json.loads(done.stdout.strip().splitlines()[-1])["policy_version"] == 11
    max_terms = []
    for level in (0, 1, 2):
        split = [json.loads(line) for line in (out / f"train-level-{level}.jsonl").open()]
        configs = {r["reasoning_gym_entry"]["generator"]: r["reasoning_gym_entry"]["config"] for r in split}
        max_terms.append(configs["chain_sum"]["max_terms"])
    assert max_terms == sorted(max_terms) and max_terms[0] < max_terms[2]
