"""`rollmesh run` end to end on a verifiers environment, with the commands docs/verifiers.md gives:
the rows exported by `_verifiers_server.py rows` in the verifiers virtualenv, an artifact root with
`environments/vf_rubric/verifiers.toml` found through ROLLMESH_EXTRA_ROOTS, the embedded mesh with
an API key, the model a deterministic OpenAI-compatible server (rollmesh.devtools.openai_server:
"What is A + B?" -> "The answer is A+B."), scored by the environment's rubric of three weighted
functions (tests/integration/test_verifiers_envs.py compares such rewards with verifiers' own)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rollmesh.devtools.openai_server import FaultConfig, openai_server_process
from rollmesh.verifier.verifiers_env import LAUNCHER
from tests.procs import ROLLMESH

ENVS = Path(__file__).resolve().parent.parent / "verifiers_envs"


def test_rollmesh_run_scores_a_verifiers_environment_with_its_rubric(
    tmp_path: Path, verifiers_python: Path
) -> None:
    folder = tmp_path / "root" / "environments" / "vf_rubric"
    folder.mkdir(parents=True)
    (folder / "verifiers.toml").write_text(
        f'env_id = "vf_rubric"\npython = "{verifiers_python}"\npaths = ["{ENVS}"]\n'
    )
    rows_path = tmp_path / "vf_rubric.jsonl"
    argv = [str(verifiers_python), str(LAUNCHER), "rows", "--env-id", "vf_rubric", "--path", str(ENVS)]
    rows_path.write_text(subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout)
    rows = [json.loads(ln) for ln in rows_path.read_text().splitlines() if ln.strip()]
    env = {**os.environ, "ROLLMESH_API_KEY": "vf-e2e-key", "ROLLMESH_EXTRA_ROOTS": str(tmp_path / "root")}
    with openai_server_process(FaultConfig(answer="no idea")) as (url, _):
        argv = ["run", "--input", str(rows_path), "--environment", "vf_rubric", "--base-url", url]
        argv += ["--model", "tiny", "--output-dir", str(tmp_path / "runs"), "--json"]
        done = subprocess.run(
            [str(ROLLMESH), *argv], capture_output=True, text=True, timeout=600, check=False, env=env
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and result["metrics"]["num_rollouts"] == len(rows) == 4
    out = [json.loads(ln) for ln in Path(result["paths"]["rollouts.jsonl"]).open()]
    for row in out:
        # "The answer is N.": exact (1.0) + a number (0.5) + brevity 0.25 / (1 + 4 words)
        assert row["chat_messages"][-1]["content"] == f"The answer is {row['expected_answer']}."
        assert row["reward"] == pytest.approx(1.0 + 0.5 + 0.25 / 5)
        assert set(row["reward_components"]) == {"exact", "has_number", "brevity", "num_turns"}
