"""`rollmesh run` end to end through the NeMo Gym bridge: the embedded mesh, with an API key, its
verifier managing NeMo Gym's own example_multi_turn_gymnasium server (the NeMo Gym 0.4.0
virtualenv) found through ROLLMESH_EXTRA_ROOTS, the model a deterministic OpenAI-compatible server
(rollmesh.devtools.openai_server) answering every turn "The Eiffel tower.": each of the server's
example rows is an episode that goes through its follow-ups and ends on the server's done."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from rollmesh.devtools.openai_server import FaultConfig
from rollmesh.devtools.openai_server import openai_server_process
from tests.procs import ROLLMESH


def test_rollmesh_run_plays_nemo_gyms_rows_through_the_bridge(
    tmp_path: Path, nemo_gym_python: Path, nemo_gym_servers: Path
) -> None:
    folder = tmp_path / "root" / "environments" / "ng_multi_turn"
    folder.mkdir(parents=True)
    (folder / "nemo_gym.toml").write_text(
        f'server = "example_multi_turn_gymnasium"\npython = "{nemo_gym_python}"\n'
    )
    rows_path = nemo_gym_servers / "example_multi_turn_gymnasium" / "data" / "example.jsonl"
    rows = [json.loads(ln) for ln in rows_path.read_text().splitlines() if ln.strip()]
    env = {**os.environ, "ROLLMESH_API_KEY": "bridge-e2e-key", "ROLLMESH_EXTRA_ROOTS": str(tmp_path / "root")}
    with openai_server_process(FaultConfig(answer="The Eiffel tower.")) as (url, _):
        argv = ["run", "--input", str(rows_path), "--environment", "ng_multi_turn", "--base-url", url]
        argv += ["--model", "tiny", "--max-steps", "8", "--output-dir", str(tmp_path / "runs"), "--json"]
        done = subprocess.run(
            [str(ROLLMESH), *argv], capture_output=True, text=True, timeout=600, check=False, env=env
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and result["metrics"]["num_rollouts"] == len(rows)
    out = [json.loads(ln) for ln in Path(result["paths"]["rollouts.jsonl"]).open()]
    by_task = {r["task_index"]: r for r in out}
    for i, row in enumerate(rows):
        got = by_task[i]
        steps = got["env_steps"]
        assert len(steps) == len(row["follow_ups"]) + 1 and steps[-1]["done"], steps
        assert got["reward"] == (1.0 if row["expected_answer"].lower() in "the eiffel tower." else 0.0)
    assert sum(r["reward"] for r in out) == 1.0  # only "Eiffel" is in the answer
