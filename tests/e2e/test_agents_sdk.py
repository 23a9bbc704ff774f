"""An agent program on the OpenAI Agents SDK (examples/agents/agents_sdk_agent.py, openai-agents 0.24 in a
virtualenv of its own: scripts/agents_sdk_venv.py) through `rollmesh run` on the `session_state`
tool environment (fake backend playing the counter), with both of the SDK's model classes, warm
(docs/external-agents.md's block) and cold, under job ids long enough that tool-call ids once
repeated within a job: every rollout is scored 1, every token record valid, every call id unique."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.tokens import validate_rollout
from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.procs import REPO
from tests.procs import ROLLMESH

DOC = DOCS / "external-agents.md"
DATA = REPO / "services/rollmesh/builtin/environments/session_state/data/example.jsonl"
SCRIPT = "rollmesh.devtools.fake_scripts:counter_agent"


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "agents_sdk_venv.py")],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    if done.returncode == 3:
        pytest.skip(f"no Python 3.11 for the Agents SDK's virtualenv: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def _rows(runs: Path, job: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (runs / job / "rollouts.jsonl").read_text().splitlines()]


def _checked(rows: list[dict[str, Any]], n: int, mode: str) -> None:
    assert len(rows) == n
    tok = FakeTokenizer()
    ids = [tc["id"] for r in rows for m in r["chat_messages"] for tc in m.get("tool_calls") or []]
    assert len(ids) == 2 * n and len(set(ids)) == len(ids)  # increment, read: each id its own
    for row in rows:
        run = row["agent_program"]
        assert row["reward"] == 1.0, run["stderr"][-2000:]
        assert (run["mode"], run["exit_code"], run["calls"], run["tool_calls"]) == (mode, 0, 3, 2)
        assert run["stdout"].startswith("The counter is")
        assert validate_rollout(Rollout.from_row(row), tokenizer=tok) == []


def test_the_agents_sdk_with_both_model_classes_warm(tmp_path: Path, sdk_python: Path) -> None:
    block = bash_block("## The OpenAI Agents SDK", DOC)
    done = run_block(block, {}, tmp_path, {"RUNS": str(tmp_path)}, cwd=REPO, timeout_s=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (done.stdout + done.stderr).count("checked 12 token records: 12 valid, 0 invalid") == 2
    for job in ("agents-sdk-chat", "agents-sdk-responses"):
        _checked(_rows(tmp_path, job), 12, "warm")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_agents_sdk_runs_cold_too(tmp_path: Path, sdk_python: Path, api: str) -> None:
    job = f"a-job-id-well-past-eight-characters-{api}"
    done = subprocess.run(
        [
            str(ROLLMESH),
            "run", "--backend", "fake", "-e", "session_state", "-d", str(DATA), "--limit", "2",
            "--output-dir", str(tmp_path), "--job-id", job,
            "--agent-program", f"{sdk_python} examples/agents/agents_sdk_agent.py --api {api}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "ROLLMESH_FAKE_SCRIPT": SCRIPT},
        timeout=900,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    _checked(_rows(tmp_path, job), 2, "command")
