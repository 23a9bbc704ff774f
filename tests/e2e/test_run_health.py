"""`rollmesh run` reports its job's rollout health from metrics.json: a line on stderr naming each
finding's share, and `health` in --json. The fake model echoes the question, so every rollout of
the arithmetic benchmark answers without a finding."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.procs import ROLLMESH

ARGS = ["run", "--backend", "fake", "--benchmark", "arithmetic", "--limit", "3", "-n", "2"]


def test_run_reports_the_jobs_health(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROLLMESH), *ARGS, "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode in (0, 3), done.stderr
    health = json.loads(done.stdout)["health"]
    assert health["checked"] == 6 and set(health["findings"]) >= {"empty_turn", "repeated_output"}
    assert health["not_checked"] == {"near_context_limit": health["not_checked"]["near_context_limit"]}
    table = subprocess.run([str(ROLLMESH), *ARGS], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "health: " in table.stderr, table.stderr
