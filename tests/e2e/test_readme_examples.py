"""The SDK examples (README.md, docs/sdk.md) and the grpcurl cookbook (docs/grpcurl.md) run as
written against a mesh started with `rollmesh up` (the table of commands and flags:
tests/unit/test_readme_cli.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import README
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.procs import ROLLMESH


def sdk_examples(page: Path) -> list[str]:
    return re.findall(r"<!-- sdk-example -->\n```python\n(.*?)```", page.read_text(), flags=re.DOTALL)


EXAMPLES = sdk_examples(DOCS / "sdk.md")


def test_readme_has_sdk_examples() -> None:
    assert len(EXAMPLES) >= 2


def run_example(code: str, addrs: dict[str, str], tmp_path: Path) -> str:
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, **{f"ROLLMESH_{k.upper()}_ADDR": v for k, v in addrs.items()}}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the example printed nothing"
    return done.stdout


def test_the_readme_sdk_example_runs(mesh: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    [example] = sdk_examples(README)
    assert "pass@k: {1: " in run_example(example, mesh[0], tmp_path)


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_sdk_example_runs(index: int, mesh: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    stdout = run_example(EXAMPLES[index], mesh[0], tmp_path)
    if index == 0:
        assert "environments:" in stdout and "pass@4" in stdout
    else:
        assert "arithmetic" in stdout and "1.0 5" in stdout


def test_readme_grpcurl_cookbook_runs_as_written(mesh: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """Each command of the cookbook, with the default ports replaced by the mesh's and JOB_ID by a
    job it submitted, exits 0."""
    addrs, _ = mesh
    script = bash_block("# grpcurl cookbook", DOCS / "grpcurl.md")
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
