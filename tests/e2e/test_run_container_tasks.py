"""`rollmesh run` end to end on the test suite's Harbor tasks (tests/container_tasks), daemonless
machines: the oracle job (`--oracle`: every task with a solution scores 1, the rest fail by name),
and the fake model playing the tasks through the machine's tools (rollmesh.devtools.fake_scripts:
container_agent): solved tasks score 1, graders that break fail by name, never as a 0; no machine of
either job is left behind."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollmesh.verifier.bridges.container.daemonless import MACHINES_DIR
from rollmesh.verifier.bridges.container.daemonless import DaemonlessProvider
from rollmesh.verifier.bridges.container.task import load_tasks
from rollmesh.verifier.bridges.container.task import rows
from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.procs import ROLLMESH

ROOT = Path(__file__).resolve().parents[1] / "container_tasks"
TOOL_LOOP = Path(__file__).resolve().parents[2] / "examples" / "agents" / "tool_loop.py"
TASKS = ROOT / "environments" / "harbor_demo" / "tasks"
DOC = DOCS / "container-tasks.md"
pytestmark = [
    pytest.mark.skipif(
        DaemonlessProvider().problem() != "", reason=f"daemonless machines: {DaemonlessProvider().problem()}"
    ),
    # The first run makes the local Debian base (debootstrap: minutes) and the tasks' images.
    pytest.mark.timeout(1800),
]


def _doc_command(after: str) -> list[str]:
    """The arguments of docs/container-tasks.md's `rollmesh run` after `after`, its `my_tasks` this
    suite's harbor_demo."""
    command = bash_block(after, DOC).replace("environments/my_tasks/tasks", str(TASKS))
    words = shlex.split(command.replace("my_tasks", "harbor_demo"), comments=True)
    assert words[:2] == ["rollmesh", "run"], command
    return words[2:]


def _run(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None, dataset: Path | None = TASKS
) -> dict[str, Any]:
    """`rollmesh run` on `dataset` (None: `extra` names it) in the harbor_demo environment."""
    backend = [] if "--oracle" in extra else ["--backend", "fake"]  # an oracle job starts no model
    given = ["--input", str(dataset), "--environment", "harbor_demo"] if dataset is not None else []
    argv = [str(ROLLMESH), "run", *backend, *given]
    argv += ["--output-dir", str(tmp_path / "runs"), "--json", "--allowed-failures", "8", *extra]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "ROLLMESH_EXTRA_ROOTS": str(ROOT), **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = [json.loads(ln) for ln in Path(result["paths"]["rollouts.jsonl"]).open()]
    return {r["task_id"]: r for r in found}


def _failures(result: dict[str, Any]) -> dict[str, str]:
    path = Path(result["paths"]["failures.jsonl"])
    lines = [json.loads(ln) for ln in path.open()] if path.exists() else []
    names = [row["task_id"] for row in rows(TASKS)]  # the dataset's order: a failure names its index
    return {names[f["task_index"]]: f["error_class"] for f in lines}


def _machines_of(job_id: str) -> list[str]:
    found = []
    for folder in MACHINES_DIR.glob("rm-*"):
        try:
            if json.loads((folder / "label.json").read_text())["job"] == job_id:
                found.append(folder.name)
        except (OSError, ValueError, KeyError):
            continue
    return found


def test_the_oracle_job_scores_every_task_with_a_solution_one(tmp_path: Path) -> None:
    result = _run(tmp_path, *_doc_command("## The oracle: a conformance check"), dataset=None)
    rows = _rows(result)
    solved = {p.parent.parent.name for p in TASKS.glob("*/solution/solve.sh")}
    assert {name: row["reward"] for name, row in rows.items()} == dict.fromkeys(solved, 1.0)
    for row in rows.values():
        assert row["finish_reason"] == "oracle" and row["verify_details"]["oracle"] is True
    failures = _failures(result)
    assert failures.pop("build-fails") == "IMAGE_BUILD_FAILED"
    assert set(failures.values()) == {"NO_SOLUTION"} and not set(failures) & solved
    assert _machines_of(result["job_id"]) == []


def test_the_fake_model_works_through_the_tools_and_broken_graders_fail_by_name(tmp_path: Path) -> None:
    script = {"ROLLMESH_FAKE_SCRIPT": "rollmesh.devtools.fake_scripts:container_agent"}
    args = _doc_command("never by a path taken from the row")  # and its --max-steps 30: 6 is enough
    result = _run(tmp_path, *args, "--max-steps", "6", env=script, dataset=None)
    rows, failures = _rows(result), _failures(result)
    for solved in ("hello-file", "fix-calc", "no-internet", "hanging-agent"):
        assert rows[solved]["reward"] == 1.0, rows[solved]["verify_details"]
    hanging = rows["hanging-agent"]
    assert hanging["verify_details"]["agent_timed_out"] is True
    assert hanging["finish_reason"] == "agent_timeout"  # the cut command's answer ended the agent
    outputs = [m["content"] for m in hanging["chat_messages"] if m["role"] == "tool"]
    assert len(outputs) == 2 and "[the command was cut after" in outputs[1]
    fixed = [m["content"] for m in rows["fix-calc"]["chat_messages"] if m["role"] == "tool"]
    assert "return a + b" in fixed[-1]
    assert {name: rows[name]["reward"] for name in ("memory-hog", "answer-json")} == {
        "memory-hog": 0.0,  # the model could not do these: a 0 from their graders
        "answer-json": 0.0,
    }
    assert rows["answer-json"]["reward_components"] == {
        "reward": 0.0,
        "parsed": 0.0,
        "answer": 0.0,
        "unit": 0.0,
    }
    assert failures == {
        "broken-tests": "TEST_SCRIPT_FAILED",
        "bad-reward": "BAD_REWARD_FILE",
        "slow-tests": "TEST_TIMEOUT",
        "build-fails": "IMAGE_BUILD_FAILED",
    }
    assert _machines_of(result["job_id"]) == []


def test_an_agent_programs_tool_calls_run_in_the_rollouts_machine(tmp_path: Path) -> None:
    """examples/agents/tool_loop.py (plain `openai` SDK) with the fake model's container_agent: its
    calls to ROLLMESH_TOOLS_URL reach the same tools, in the rollout's machine."""
    tasks = load_tasks(TASKS)
    dataset = tmp_path / "two.jsonl"
    dataset.write_text("".join(json.dumps(tasks[n].row()) + "\n" for n in ("hello-file", "fix-calc")))
    script = {"ROLLMESH_FAKE_SCRIPT": "rollmesh.devtools.fake_scripts:container_agent"}
    program = f"{sys.executable} {TOOL_LOOP}"
    result = _run(tmp_path, "--max-steps", "6", "--agent-program", program, env=script, dataset=dataset)
    found = _rows(result)
    assert {name: row["reward"] for name, row in found.items()} == {"hello-file": 1.0, "fix-calc": 1.0}
    for row in found.values():
        assert row["agent_program"]["tool_calls"] == 2 and row["verify_details"]["commands"] == 2
    assert _machines_of(result["job_id"]) == []
