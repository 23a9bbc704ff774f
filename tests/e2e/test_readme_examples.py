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

from tests.procs import GRPCURL, ROLLMESH

README = Path(__file__).resolve().parents[2] / "README.md"
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


def _cookbook() -> str:
    """The grpcurl cookbook's first block (the calls against a keyless `rollmesh up`)."""
    section = README.read_text().split("## grpcurl cookbook", 1)[1]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0]


def test_readme_grpcurl_cookbook_runs_as_written(mesh: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """Each command of the cookbook, with the default ports replaced by the mesh's and JOB_ID by a
    job it submitted, exits 0 (bash -e stops at the first that does not)."""
    addrs, _ = mesh
    script = _cookbook()
    assert script.count("grpcurl ") >= 10
    for service, port in (("registry", 50051), ("verifier", 50052), ("gateway", 50053), ("scheduler", 50054)):
        script = script.replace(f"127.0.0.1:{port}", addrs[service])
    assert "127.0.0.1:5005" not in script, "a cookbook command uses a port the test does not map"
    submit = ["jobs", "submit", "--benchmark", "arithmetic", "--limit", "2", "-n", "2", "--wait", "--json"]
    submitted = subprocess.run(
        [str(ROLLMESH), *submit, "--scheduler", addrs["scheduler"]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    path = tmp_path / "cookbook.sh"
    path.write_text("set -e\n" + script.replace("JOB_ID", job_id))
    env = {**os.environ, "PATH": f"{GRPCURL.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    out = done.stdout
    assert "rollmesh.v1.ArtifactRegistry" in out and '"status": "SERVING"' in out
    assert '"reward": 1' in out and f'"job_id": "{job_id}"' in out
