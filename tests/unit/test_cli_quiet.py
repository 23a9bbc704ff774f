"""`rollmesh run`'s capture of the services' output (commands/_quiet.py), in a child interpreter:
what libraries print from Python, from C (a raw write to fd 2), from a child process and at
interpreter exit lands in the log; the CLI's own lines and `rollmesh.*` log lines reach the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import atexit, logging, os, subprocess, sys
from pathlib import Path
from rollmesh.commands._common import err, out
from rollmesh.commands._quiet import services_output

# Registered first, so it runs last at exit, as nanobind's leak report does (after every atexit hook).
atexit.register(lambda: os.write(2, b"nanobind: leaked 4 instances!\n"))
output_dir, verbose = Path(sys.argv[1]), sys.argv[2] == "verbose"
with services_output(output_dir, verbose=verbose) as log:
    err.print("starting registry")
    print("INFO serve -- Started Serve")
    os.write(2, b"(raylet) Task ServeController.listen_for_change failed\n")
    subprocess.run(["sh", "-c", "echo vllm child says hi >&2"], check=True)
    logging.getLogger("ray").warning("SIGTERM handler is not set")
    logging.getLogger("rollmesh.serving").warning("ray_start_retry")
    logging.getLogger().handlers[0].flush()
    logging.getLogger().handlers[-1].flush()
    if log:
        (output_dir / "job-1").mkdir(exist_ok=True)
        log.into_job_folder(str(output_dir / "job-1"))
        print("written after the move")
    if sys.argv[3] == "fail":
        raise SystemExit(4)
out.print("metrics table")
print(f"log: {log.path if log else '-'}")
"""


def run_child(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "runs"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


THIRD_PARTY = ("Started Serve", "(raylet)", "vllm child says hi", "SIGTERM handler", "nanobind")


def test_the_terminal_shows_rollmesh_lines_and_the_log_has_the_rest(tmp_path: Path) -> None:
    done = run_child(tmp_path, "quiet", "ok")
    assert done.returncode == 0, done.stderr
    shown = done.stdout + done.stderr
    assert "starting registry" in done.stderr and "ray_start_retry" in done.stderr
    assert done.stdout.splitlines() == ["metrics table", f"log: {tmp_path / 'runs/job-1/services.log'}"]
    assert not [word for word in THIRD_PARTY if word in shown], shown
    log = (tmp_path / "runs/job-1/services.log").read_text()
    for word in (*THIRD_PARTY, "written after the move"):
        assert word in log
    assert "ray_start_retry" not in log and "metrics table" not in log
    assert list((tmp_path / "runs").iterdir()) == [tmp_path / "runs/job-1"]  # moved, not copied


def test_a_resumed_job_keeps_the_first_runs_log(tmp_path: Path) -> None:
    (tmp_path / "runs/job-1").mkdir(parents=True)
    (tmp_path / "runs/job-1/services.log").write_text("the first run\n")
    done = run_child(tmp_path, "quiet", "ok")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == f"log: {tmp_path / 'runs/job-1/services.2.log'}"
    assert (tmp_path / "runs/job-1/services.log").read_text() == "the first run\n"
    assert "(raylet)" in (tmp_path / "runs/job-1/services.2.log").read_text()


def test_a_failed_command_names_the_log(tmp_path: Path) -> None:
    done = run_child(tmp_path, "quiet", "fail")
    assert done.returncode == 4
    assert f"Ray, Serve and vLLM output: {tmp_path / 'runs/job-1/services.log'}" in done.stderr
    assert "(raylet)" not in done.stderr and "(raylet)" in (tmp_path / "runs/job-1/services.log").read_text()


def test_verbose_captures_nothing(tmp_path: Path) -> None:
    done = run_child(tmp_path, "verbose", "ok")
    assert done.returncode == 0, done.stderr
    for word in ("(raylet)", "vllm child says hi", "nanobind", "starting registry"):
        assert word in done.stderr
    assert "log: -" in done.stdout and not (tmp_path / "runs").exists()
