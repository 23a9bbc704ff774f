"""A confined program whose script lives under /tmp (a checkout there, pytest's tmp_path) imports its
sibling module: the script's folder is readable, not the script alone (#43: docs/external-agents.md's
compacting_loop.py failed `No module named 'tool_loop'` in a checkout under /tmp, the child's own
/tmp hiding the sibling). What the job hides inside that folder (its output, its dataset) stays
hidden; `/tmp` itself and folders other users cannot enter are never made readable whole."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rollmesh.mesh.confine import program_folder, program_paths
from tests.procs import run_confined

PROGRAM = """
import os, helper
here = os.path.dirname(os.path.abspath(__file__))
print(helper.WHERE)
print(sorted(os.listdir(os.path.join(here, "runs"))))
print(repr(open(os.path.join(here, "gold.jsonl")).read()))
"""


def program(tmp_path: Path) -> Path:
    """`prog/main.py` importing `prog/helper.py`, beside a job output folder and a dataset file."""
    prog = tmp_path / "prog"
    (prog / "runs" / "job-1").mkdir(parents=True)
    (prog / "runs" / "job-1" / "rollouts.jsonl").write_text('{"reward": 1}\n')
    (prog / "gold.jsonl").write_text('{"expected_answer": "42"}\n')
    (prog / "helper.py").write_text("WHERE = 'the sibling'\n")
    (prog / "main.py").write_text(PROGRAM)
    return prog


def test_the_folder_of_a_named_script_is_readable(tmp_path: Path) -> None:
    prog = program(tmp_path)
    assert str(prog) in program_paths([sys.executable, str(prog / "main.py")])
    assert program_folder(str(prog / "main.py")) == str(prog)


def test_never_tmp_itself_nor_a_folder_others_cannot_enter(tmp_path: Path) -> None:
    assert program_folder("/tmp/agent.py") == ""
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "agent.py").write_text("")
    assert program_folder(str(closed / "agent.py")) == ""
    assert str(closed) not in program_paths([sys.executable, str(closed / "agent.py")])


@pytest.mark.skipif(os.geteuid() != 0, reason="uid and mount confinement needs root")
async def test_a_confined_script_under_tmp_imports_its_sibling_and_sees_no_hidden_file(
    tmp_path: Path,
) -> None:
    prog = program(tmp_path)
    assert str(prog).startswith("/tmp/")  # what the child's fresh /tmp would hide
    argv = [sys.executable, str(prog / "main.py")]
    done, mode = await run_confined(
        argv, tmp_path / "mode", hidden=(str(prog / "runs"), str(prog / "gold.jsonl"))
    )
    assert "mount" in mode, mode
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["the sibling", "[]", "''"]
