"""docs/environment-turns.md as a reader follows it: the Guess game saved where the page says, its
row written and `rollmesh run` run as written (the embedded gateway on the fake model), then the
"Other drivers" program run as written against a verifier serving the game."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.procs import ROLLMESH
from tests.procs import spawn_server

PAGE = DOCS / "environment-turns.md"


def python_block(after: str) -> str:
    section = PAGE.read_text().split(after, 1)[1]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[0]


def test_the_guess_game_runs_as_the_page_says(tmp_path: Path) -> None:
    env = tmp_path / "environments" / "guess" / "env.py"
    env.parent.mkdir(parents=True)
    env.write_text(python_block("A number-guessing game"))
    script = bash_block("Save it as `environments/guess/env.py`", PAGE)
    done = run_block(script, {}, tmp_path, {"ROLLMESH_GATEWAY_BACKEND": "fake"}, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "mean reward" in done.stdout, done.stdout[-2000:]

    program = tmp_path / "drive.py"
    with spawn_server([str(ROLLMESH), "serve", "verifier", "--port", "0"], cwd=tmp_path) as verifier:
        program.write_text(python_block("## Other drivers").replace("127.0.0.1:50052", verifier.address))
        run = subprocess.run(
            [sys.executable, str(program)], capture_output=True, text=True, timeout=120, check=False
        )
    assert run.returncode == 0, run.stderr[-3000:]
    first, second = run.stdout.splitlines()[:2]
    assert first.startswith("True ") and "Guess it." in first, run.stdout
    assert second == "-0.125 False ['50 is too high']", run.stdout
