"""`rollmesh run` end to end on verifiers 0.4 (`verifiers.v1`) tasksets, with the commands
docs/verifiers.md gives: the rows exported by `_verifiers_v1_server.py rows` in the verifiers 0.4
virtualenv, an artifact root holding `environments/<taskset>/verifiers.toml` found through
ROLLMESH_EXTRA_ROOTS, the embedded mesh with an API key and its fake backend playing the tasks
(ROLLMESH_FAKE_SCRIPT: tests/integration/test_verifiers_v1.py's player). vf_v1_calc's Toolset tools
run per session and its two weighted rewards score; vf_v1_judged's `reference` judge asks the
embedded mesh's own model through its OpenAI facade (no judge URL given anywhere).
tests/integration/test_verifiers_v1.py compares such rewards with verifiers' own scoring."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.procs import ROLLMESH

REPO = Path(__file__).resolve().parent.parent.parent
ENVS = REPO / "tests" / "verifiers_envs"
PLAYER = "tests.integration.test_verifiers_v1:plays_v1"
#: The 0.4 venv's interpreter as the page names it (where scripts/verifiers_venv.py caches it).
DOC_VENV_PYTHON = "~/.cache/rollmesh/verifiers/0.4.0/venv/bin/python"


def run(tmp_path: Path, python: Path, taskset: str, extra: str = "") -> list[dict[str, Any]]:
    folder = tmp_path / taskset / "root" / "environments" / taskset
    folder.mkdir(parents=True)
    (folder / "verifiers.toml").write_text(
        f'taskset = "{taskset}"\npython = "{python}"\npaths = ["{ENVS}"]\n{extra}'
    )
    # docs/verifiers.md's `rows` command for 0.4, for this taskset (`--path`: a module, not installed)
    script = textwrap.dedent(bash_block("3. Its rows (`rows` also takes", DOCS / "verifiers.md"))
    script = script.replace(DOC_VENV_PYTHON, str(python)).replace("my_taskset", taskset)
    script = script.replace(f"rows --taskset {taskset}", f"rows --taskset {taskset} --path {ENVS}")
    exported = run_block(script, {}, tmp_path, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    rows_path = tmp_path / f"{taskset}.jsonl"
    rows = [json.loads(ln) for ln in rows_path.read_text().splitlines() if ln.strip()]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "ROLLMESH_API_KEY": "vf1-e2e-key",
        "ROLLMESH_EXTRA_ROOTS": str(tmp_path / taskset / "root"),
        "ROLLMESH_FAKE_SCRIPT": PLAYER,
    }
    argv = ["run", "--input", str(rows_path), "--environment", taskset, "--backend", "fake"]
    argv += ["--max-steps", "8", "--output-dir", str(tmp_path / "runs"), "--json"]
    done = subprocess.run(
        [str(ROLLMESH), *argv], capture_output=True, text=True, timeout=600, check=False, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and result["metrics"]["num_rollouts"] == len(rows)
    out = [json.loads(ln) for ln in Path(result["paths"]["rollouts.jsonl"]).open()]
    return sorted(out, key=lambda r: r["task_index"])


def test_rollmesh_run_a_taskset_with_a_toolset_and_one_judged_by_the_mesh_model(
    tmp_path: Path, verifiers_v1_python: Path
) -> None:
    calc = run(tmp_path, verifiers_v1_python, "vf_v1_calc")
    assert len(calc) == 4
    for row in calc:
        calls = [c["function"]["name"] for m in row["chat_messages"] for c in m.get("tool_calls") or []]
        tools = [m["content"] for m in row["chat_messages"] if m["role"] == "tool"]
        assert calls == ["add", "multiply"] and tools[-1] == row["expected_answer"]
        wrong = row["responses_create_params"]["input"][-1]["content"].endswith("* 3.")
        assert row["reward"] == (0.5 if wrong else 1.5), row
    judged = run(tmp_path, verifiers_v1_python, "vf_v1_judged", '[[config.task.judges]]\nid = "reference"\n')
    assert [r["reward"] for r in judged] == [1.0, 0.0, 1.0]  # "I think 13" for 7 + 5: the judge said no
    assert [r["reward_components"]["reply_words"] for r in judged] == [4.0, 3.0, 4.0]
