"""The offline results commands (`aggregate`, `profile`) as a script sees them: stdout holds only
what the command prints (JSON), log lines go to stderr; a stored row with a reward that is not a
finite number is refused naming its line instead of turning every mean into NaN."""

from __future__ import annotations

import json
import re
from pathlib import Path

from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from tests.procs import run_cli


def _row(t: int, reward: float = 1.0) -> str:
    r = Rollout(key=RolloutKey(t, 0), job_id="job1", task={"q": t}, messages=[], reward=reward)
    return json.dumps(r.to_row())


async def test_stdout_is_only_the_json_even_when_a_line_is_logged(tmp_path: Path) -> None:
    """A torn last line is skipped with a log line: structlog, never configured for these commands,
    printed it on stdout ahead of the JSON (`rollmesh aggregate F | jq` failed)."""
    path = tmp_path / "rollouts.jsonl"
    path.write_text(_row(0) + "\n" + _row(1)[:40])  # the second row is being written (or torn)
    for command in ("aggregate", "profile"):
        code, out, err = await run_cli(command, str(path), env={"ROLLMESH_LOG_LEVEL": "debug"})
        assert code == 0, err
        assert "sink_partial_last_line_skipped" in err and "sink_partial_last_line_skipped" not in out
        first = json.loads(out.splitlines()[0] if command == "profile" else out)
        assert first["num_rollouts"] == 1, first


async def test_a_stored_reward_that_is_not_a_number_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text(_row(0) + "\n" + _row(1).replace('"reward": 1.0', '"reward": NaN') + "\n")
    code, out, err = await run_cli("aggregate", str(path), "--json")
    assert code == 2 and out == "", (out, err)
    said = "not a rollout row of rollmesh or NeMo Gym (ValueError: reward is nan, not a finite number)"
    assert f"{path}:2: {said}" in err
    assert "Traceback" not in err


async def test_off_a_terminal_the_progress_line_ends_before_the_next_line(tmp_path: Path) -> None:
    """stderr to a file or pipe: the job's last progress line is a line of its own (it ran into the
    health line: `... 0:00:21health: no finding`)."""
    code, _, err = await run_cli(
        "run", "--benchmark", "arithmetic", "--backend", "fake", "--limit", "4", "-n", "2",
        "-o", str(tmp_path / "runs"),
    )  # fmt: skip
    assert code == 0, err
    lines = err.splitlines()
    progress = [i for i, line in enumerate(lines) if " 8/8 " in line and "rollouts/s" in line]
    assert progress, err
    last = lines[progress[-1]]
    assert re.search(r"failed 0 \d+:\d\d:\d\d$", last), last
    assert lines[progress[-1] + 1].startswith("health: "), err
