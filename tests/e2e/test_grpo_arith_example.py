"""examples/grpo_arith.py, short: 3 GRPO steps against an embedded mesh with the fake model engine.

The loop runs end to end (sink -> GRPO step -> checkpoint -> UpdateWeights -> held-out eval), the
policy version advances through the token records (with max staleness 1, step 3's rollouts come from
version >= 1), and it writes metrics.csv, metrics.png and summary.json.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_arith.py"


def test_grpo_example_runs_three_steps_and_versions_advance(tmp_path: Path) -> None:
    out = tmp_path / "grpo"
    args = ["--embedded", "--backend", "fake", "--steps", "3", "--groups", "2", "--group-size", "4"]
    args += ["--eval-every", "3", "--eval-limit", "2", "--max-staleness", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["steps"], summary["policy_version"]) == (3, 3)
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["step"] for r in rows] == ["0", "1", "2", "3"]
    assert rows[0]["pass_at_1"] != "" and rows[3]["pass_at_1"] != ""  # held-out evals before and after
    oldest_at_step_3 = int(rows[3]["rollout_versions"].split("-")[0])
    assert oldest_at_step_3 >= 1, rows[3]
    assert all(float(r["update_s"]) >= 0 for r in rows[1:])
    assert (out / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0002", "step-0003"]
