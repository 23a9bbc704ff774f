"""The README's SDK examples and grpcurl cookbook run as written against a mesh started with
`rollmesh up` (the table of commands and flags: tests/unit/test_readme_cli.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.readme_blocks import README, bash_block, run_block
from tests.procs import ROLLMESH

EXAMPLES = re.findall(r"<!-- sdk-example -->\n```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_sdk_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_sdk_example_runs(index: int, mesh: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    addrs, _ = mesh
    script = tmp_path / f"example_{index}.py"
    script.write_text(EXAMPLES[index])
    env = {**os.environ, **{f"ROLLMESH_{k.upper()}_ADDR": v for k, v in addrs.items()}}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the example printed nothing"
    if index == 0:
        assert "environments:" in done.stdout and "pass@4" in done.stdout
    else:
        assert "arithmetic" in done.stdout and "1.0 5" in done.stdout


def test_readme_grpcurl_cookbook_runs_as_written(mesh: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """Each command of the cookbook, with the default ports replaced by the mesh's and JOB_ID by a
    job it submitted, exits 0."""
    addrs, _ = mesh
    script = bash_block("## grpcurl cookbook")
    assert script.count("grpcurl ") >= 10
    submit = ["jobs", "submit", "--benchmark", "arithmetic", "--limit", "2", "-n", "2", "--wait", "--json"]
    submitted = subprocess.run(
        [str(ROLLMESH), *submit, "--scheduler", addrs["scheduler"]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    done = run_block(script.replace("JOB_ID", job_id), addrs, tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert "rollmesh.v1.ArtifactRegistry" in out and '"status": "SERVING"' in out
    assert '"reward": 1' in out and f'"job_id": "{job_id}"' in out
