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
import textwrap
from pathlib import Path

import pytest

from rollmesh.devtools.openai_server import FaultConfig
from rollmesh.devtools.openai_server import openai_server_process
from rollmesh.verifier.bridges.verifiers_env import LAUNCHER
from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.integration.test_verifiers_envs import own_scores
from tests.procs import ROLLMESH

ENVS = Path(__file__).resolve().parent.parent / "verifiers_envs"
DOC = DOCS / "verifiers.md"


def page_steps(python: Path, url: str) -> str:
    """docs/verifiers.md's steps 3 (the rows) and 4 (run, reverify) as the page gives them, for the
    suite's vf_rubric: its `my_env` that, its /opt/vf venv `python`, `--path` to the module (not
    installed), the model server at `url` serving `tiny`."""
    rows = bash_block("under `verifier_metadata.verifiers`):", DOC)
    run = bash_block("4. Run it like any environment", DOC)
    script = textwrap.dedent(rows) + textwrap.dedent(run)
    script = script.replace("/opt/vf/bin/python", str(python)).replace("my_env", "vf_rubric")
    script = script.replace("rows --env-id vf_rubric", f"rows --env-id vf_rubric --path {ENVS}")
    return script.replace("http://127.0.0.1:8000/v1", url).replace("--model my-model", "--model tiny")


def test_rollmesh_run_scores_a_verifiers_environment_with_its_rubric(
    tmp_path: Path, verifiers_python: Path
) -> None:
    folder = tmp_path / "root" / "environments" / "vf_rubric"
    folder.mkdir(parents=True)
    (folder / "verifiers.toml").write_text(
        f'env_id = "vf_rubric"\npython = "{verifiers_python}"\npaths = ["{ENVS}"]\n'
    )
    env = {"ROLLMESH_API_KEY": "vf-e2e-key", "ROLLMESH_EXTRA_ROOTS": str(tmp_path / "root")}
    with openai_server_process(FaultConfig(answer="no idea")) as (url, _):
        done = run_block(page_steps(verifiers_python, url), {}, tmp_path, env, cwd=tmp_path, timeout_s=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(ln) for ln in (tmp_path / "vf_rubric.jsonl").read_text().splitlines() if ln.strip()]
    out = [json.loads(ln) for ln in (tmp_path / "runs" / "vf_rubric" / "rollouts.jsonl").open()]
    assert len(out) == len(rows) == 4
    for row in out:
        # "The answer is N.": exact (1.0) + a number (0.5) + brevity 0.25 / (1 + 4 words)
        assert row["chat_messages"][-1]["content"] == f"The answer is {row['expected_answer']}."
        assert row["reward"] == pytest.approx(1.0 + 0.5 + 0.25 / 5)
        assert set(row["reward_components"]) == {"exact", "has_number", "brevity", "num_turns"}
    rescored = [json.loads(ln) for ln in (tmp_path / "rescored.jsonl").open()]
    assert [r["reward"] for r in rescored] == [r["reward"] for r in out]  # reverify: the same rewards


def test_rollmesh_run_scores_a_verifiers_group_rubric_as_verifiers_score_group_does(
    tmp_path: Path, verifiers_python: Path
) -> None:
    """vf_group (a rubric with a group reward function) through `rollmesh run` on the embedded mesh,
    3 rollouts per task, the fake backend answering each rollout of a task at another length
    (fake_scripts.describes_by_seed): each row's reward and metrics are what verifiers' own
    `score_group` gives the task's stored completions in its venv."""
    folder = tmp_path / "root" / "environments" / "vf_group"
    folder.mkdir(parents=True)
    (folder / "verifiers.toml").write_text(
        f'env_id = "vf_group"\npython = "{verifiers_python}"\npaths = ["{ENVS}"]\n'
    )
    rows_path = tmp_path / "vf_group.jsonl"
    argv = [str(verifiers_python), str(LAUNCHER), "rows", "--env-id", "vf_group", "--path", str(ENVS)]
    rows_path.write_text(subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout)
    env = {
        **os.environ,
        "ROLLMESH_EXTRA_ROOTS": str(tmp_path / "root"),
        "ROLLMESH_FAKE_SCRIPT": "rollmesh.devtools.fake_scripts:describes_by_seed",
    }
    argv = ["run", "--backend", "fake", "--input", str(rows_path), "--environment", "vf_group"]
    argv += ["--num-repeats", "3", "--output-dir", str(tmp_path / "runs"), "--json"]
    done = subprocess.run(
        [str(ROLLMESH), *argv], capture_output=True, text=True, timeout=600, check=False, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and result["metrics"]["num_rollouts"] == 9
    out = sorted(
        (json.loads(ln) for ln in Path(result["paths"]["rollouts.jsonl"]).open()),
        key=lambda r: (r["task_index"], r["rollout_index"]),
    )
    for task in range(3):
        sizes = [len(r["chat_messages"][-1]["content"]) for r in out if r["task_index"] == task]
        assert len(set(sizes)) == 3  # the group's answers differ: the longest wins (1.0), all say N (0.5)
        assert [r["reward"] for r in out if r["task_index"] == task] == [
            1.5 if s == max(sizes) else 0.5 for s in sizes
        ]
    own = own_scores(verifiers_python, "vf_group", out, group=True)
    assert [o["reward"] for o in own] == [r["reward"] for r in out]
    assert [{k: float(v) for k, v in o["metrics"].items()} for o in own] == [
        r["reward_components"] for r in out
    ]
