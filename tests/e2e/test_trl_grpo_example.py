"""examples/trl_grpo.py, short, as docs/training.md's TRL page runs it: TRL's GRPOTrainer trains on a
NeMo Gym environment through rollmesh (NeMo Gym 0.4.0's own example_session_state_mgmt server behind
the bridge, managed by the verifier from an environment folder; the fake engine plays the counter with
tool calls), two steps with the weights pushed before each; and TRL's own generation arm of the
comparison on arithmetic, scored by the same verifier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import managed_counter

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl_grpo.py"


def run_example(cwd: Path, *args: str, script: str = "") -> dict[str, object]:
    env = {**os.environ, "ROLLMESH_FAKE_SCRIPT": script}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--embedded", "--backend", "fake", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def test_trl_trains_on_a_nemo_gym_environment_through_rollmesh(
    tmp_path: Path, nemo_gym_python: Path, nemo_gym_servers: Path
) -> None:
    rows = managed_counter(tmp_path, nemo_gym_python, nemo_gym_servers)
    out = tmp_path / "out"
    args = [
        "--environment",
        "ng_counter",
        "--dataset",
        str(rows),
        "--eval-dataset",
        str(rows),
        "--max-turns",
        "6",
    ]
    args += [
        "--steps",
        "2",
        "--groups",
        "2",
        "--group-size",
        "2",
        "--max-completion-length",
        "64",
        "--eval-every",
        "0",
    ]
    results = run_example(
        tmp_path, *args, "--out", str(out), script="rollmesh.devtools.fake_scripts:nemo_gym_counter_agent"
    )
    summary = results["rollmesh"]
    assert isinstance(summary, dict)
    assert (
        summary["steps"] == 2
        and summary["policy_versions"] == [0, 1, 2]
        and summary["failed_completions"] == 0
    )
    # the fake agent plays NeMo Gym's counter right: every episode the server verifies is rewarded
    assert summary["pass_at_1_first"] == summary["pass_at_1_last"] == 1.0
    assert summary["reward_first_10"] == 1.0
    jobs = sorted((out / "rollmesh" / "rollmesh" / "jobs").glob("*/rollouts.jsonl"))
    assert len(jobs) == 2
    # one job per step, run on the weights pushed before it: versions 0 then 1 (job ids are not in order)
    firsts = [json.loads(job.read_text().splitlines()[0]) for job in jobs]
    assert sorted(row["tokens"]["turns"][0]["policy_version"] for row in firsts) == ["0", "1"]
    for row in firsts:
        assert len(row["tokens"]["turns"]) >= 3
        assert any(m.get("role") == "tool" for m in row["chat_messages"])  # the server's tools ran


def test_trls_own_generation_arm_is_scored_by_the_mesh(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--generation", "trl", "--steps", "2", "--groups", "2", "--group-size", "2", "--eval-every", "0"]
    results = run_example(tmp_path, *args, "--eval-limit", "2", "--out", str(out))
    summary = results["trl"]
    assert isinstance(summary, dict)
    assert summary["steps"] == 2 and summary["policy_versions"] is None
    # TRL generated with the tiny model itself, which answers its training questions; the verifier scored them
    assert summary["reward_first_10"] is not None and summary["reward_first_10"] > 0
    assert [e["step"] for e in summary["held_out"]] == [0, 2]
