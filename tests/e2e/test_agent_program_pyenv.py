"""`--agent-program "python prog.py"` where `python` on PATH is a pyenv shim (a common set-up): the
shim execs pyenv's own files, which a confined program's mount namespace does not show, so every
rollout failed with exit 127. The command is resolved to the interpreter the shim runs where
`rollmesh run` runs (`pyenv which`), or refused with one line saying what to pass instead. Uses this
machine's real pyenv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rollmesh.scheduler.errors import AgentProgramNoModelCall
from rollmesh.scheduler.errors import AgentProgramUnstartable
from tests.procs import REPO
from tests.procs import run_cli
from tests.unit.test_external_agents import CaptureModel
from tests.unit.test_external_agents import _run

PYENV_ROOT = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
SHIM = PYENV_ROOT / "shims" / "python"
pytestmark = pytest.mark.skipif(not SHIM.is_file(), reason=f"pyenv is not installed here (no {SHIM})")

# A stdlib-only program (pyenv's interpreter has no openai SDK): one model call, then it says which
# interpreter ran it.
PROGRAM = """
import json, os, sys, urllib.request
task = json.load(sys.stdin)
call = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "m", "messages": task["messages"]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
urllib.request.urlopen(call, timeout=60).read()
print(json.dumps({"executable": os.path.realpath(sys.executable)}))
"""
DATA = REPO / "services/rollmesh/builtin/environments/arithmetic/data/example.jsonl"


def _shims_first() -> dict[str, str]:
    return {"PATH": f"{SHIM.parent}{os.pathsep}{os.environ['PATH']}"}


def _pyenv_which(env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(PYENV_ROOT / "libexec" / "pyenv"), "which", "python"],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PYENV_ROOT": str(PYENV_ROOT)},
        check=False,
    )
    return os.path.realpath(done.stdout.strip()) if done.returncode == 0 else ""


async def test_python_as_a_pyenv_shim_runs_the_interpreter_it_names(tmp_path: Path) -> None:
    env = _shims_first()
    expected = _pyenv_which(env)
    if not expected:
        pytest.skip(f"pyenv here names no interpreter for `python` ({PYENV_ROOT}): nothing to run")
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    code, _, err = await run_cli(
        *("run", "--backend", "fake", "-e", "arithmetic", "-d", str(DATA), "--limit", "2"),
        *("--output-dir", str(tmp_path / "runs"), "--job-id", "shim"),
        *("--agent-program", f"python {program}"),
        env=env,
        timeout_s=600,
    )
    assert code in (0, 3), err[-3000:]  # 3: completed, some rewards 0 (the fake model echoes)
    rows = [json.loads(line) for line in (tmp_path / "runs/shim/rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        run = row["agent_program"]
        assert run["exit_code"] == 0, run["stderr"][-2000:]
        assert json.loads(run["stdout"])["executable"] == expected


async def test_a_shim_that_names_no_interpreter_is_refused_in_one_line(tmp_path: Path) -> None:
    env = {**_shims_first(), "PYENV_VERSION": "0.0-not-installed"}
    code, _, err = await run_cli(
        *("run", "--backend", "fake", "-e", "arithmetic", "-d", str(DATA), "--limit", "1"),
        *("--output-dir", str(tmp_path / "runs"), "--agent-program", "python prog.py"),
        env=env,
        timeout_s=300,
    )
    said = " ".join(err.replace("│", " ").split())  # (typer boxes a usage error)
    assert code == 2, err[-3000:]
    assert f"'python' is a pyenv shim ({SHIM})" in said and "0.0-not-installed" in said, said
    assert "pass an interpreter's path instead of 'python'" in said and "Traceback" not in err


async def test_the_scheduler_resolves_a_shim_a_job_names_or_fails_the_rollout_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job submitted over the API may name the shim itself: the scheduler resolves it too."""
    monkeypatch.setenv("PATH", _shims_first()["PATH"])
    expected = _pyenv_which({})
    if expected:
        code = "import os, sys; print(os.path.realpath(sys.executable))"
        with pytest.raises(AgentProgramNoModelCall) as ran:  # (it ran: no model call is all it lacks)
            await _run([str(SHIM), "-c", code], CaptureModel())
        assert ran.value.agent_program["stdout"] == expected + "\n"
    monkeypatch.setenv("PYENV_VERSION", "0.0-not-installed")
    with pytest.raises(AgentProgramUnstartable) as exc:
        await _run([str(SHIM), "-c", "pass", "again"], CaptureModel())
    assert "is a pyenv shim" in exc.value.message and "pass an interpreter's path" in exc.value.message
