"""docs/external-agents.md's command blocks, run as written from the repository root: agent programs
on the plain `openai` SDK (examples/agents/) driving the `session_state` tool environment through
`rollmesh run` (embedded mesh, fake backend playing the counter) and through `rollmesh up` with
ROLLMESH_API_KEY set; every token record passes `rollmesh validate` (and the text check against the
fake tokenizer), and the built-in loop and the program doing the same loop give identical records."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.tokens import validate_rollout
from tests.e2e.conftest import rollmesh_up
from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.procs import REPO

DOC = DOCS / "external-agents.md"
SCRIPT = "rollmesh.devtools.fake_scripts:counter_agent"
ROWS = 6  # the session_state example rows


def _rows(runs: Path, job: str) -> dict[tuple[int, int], dict[str, Any]]:
    rows = [json.loads(line) for line in (runs / job / "rollouts.jsonl").read_text().splitlines()]
    return {(r["task_index"], r["rollout_index"]): r for r in rows}


def _call_ids(messages: list[dict[str, Any]]) -> list[str]:
    return [c["id"] for m in messages for c in m.get("tool_calls") or []]


def _without_call_ids(messages: list[dict[str, Any]]) -> str:
    """The messages with tool-call ids blanked: the gateway derives them from the request id, which
    holds the job id (the two jobs' only difference)."""
    ids = _call_ids(messages)
    text = json.dumps(messages, sort_keys=True)
    for k, call_id in enumerate(ids):
        text = text.replace(json.dumps(call_id), f'"call {k}"')
    return text


def _valid_with_text(rows: dict[tuple[int, int], dict[str, Any]]) -> None:
    tok = FakeTokenizer()
    for key, row in rows.items():
        assert validate_rollout(Rollout.from_row(row), tokenizer=tok) == [], key


def test_a_program_and_the_built_in_loop_give_identical_token_records(tmp_path: Path) -> None:
    block = bash_block("## Run an agent program", DOC)
    done = run_block(block, {}, tmp_path, {"RUNS": str(tmp_path)}, cwd=REPO, timeout_s=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"checked {2 * ROWS} token records: {2 * ROWS} valid, 0 invalid" in done.stdout + done.stderr
    builtin, program = _rows(tmp_path, "builtin"), _rows(tmp_path, "tool-loop")
    assert len(builtin) == len(program) == 2 * ROWS
    for key, row in program.items():
        assert row["reward"] == builtin[key]["reward"] == 1.0, key
        assert row["tokens"] == builtin[key]["tokens"], key  # ids, mask, logprobs, spans: the same
        assert row["tokens"]["logprobs_recorded"] is True
        assert len(row["tokens"]["turns"]) == 3  # increment, read, answer
        assert _without_call_ids(row["chat_messages"]) == _without_call_ids(builtin[key]["chat_messages"])
        run = row["agent_program"]
        assert (run["exit_code"], run["calls"], run["tool_calls"], run["segments"]) == (0, 3, 2, 1)
        assert run["stdout"].startswith("The counter is") and "agent_program" not in builtin[key]
        assert run["sandbox"] == ("uid+mount+pid+network" if os.geteuid() == 0 else "limits")
    _valid_with_text(program)
    for rows in (builtin, program):  # every tool call of a job has an id of its own
        ids = [i for row in rows.values() for i in _call_ids(row["chat_messages"])]
        assert len(ids) == 2 * len(rows) == len(set(ids))


def test_a_compacting_program_and_a_responses_program(tmp_path: Path) -> None:
    block = bash_block("## Compacting agents and the Responses API", DOC)
    done = run_block(block, {}, tmp_path, {"RUNS": str(tmp_path)}, cwd=REPO, timeout_s=600)
    assert done.returncode == 0, done.stderr[-4000:]
    compacting, responses = _rows(tmp_path, "compacting"), _rows(tmp_path, "responses")
    assert len(compacting) == len(responses) == ROWS
    for row in compacting.values():
        assert row["reward"] == 1.0 and row["agent_program"]["segments"] == 2
        assert [t["segment"] for t in row["tokens"]["turns"]] == [0, 0, 1]
        opening = [m for m in row["chat_messages"] if m.get("rollmesh_segment")]
        assert len(opening) == 1 and "Progress:" in opening[0]["content"]
    for row in responses.values():
        assert row["reward"] == 1.0 and row["agent_program"]["segments"] == 1
        assert len(row["tokens"]["turns"]) == 3
    _valid_with_text(compacting)
    _valid_with_text(responses)


def test_through_rollmesh_up_with_an_api_key(tmp_path: Path) -> None:
    env = {
        "ROLLMESH_API_KEY": "mesh-secret",
        "ROLLMESH_FAKE_SCRIPT": SCRIPT,
        "ROLLMESH_OPENAI_HTTP_PORT": "0",
    }
    with rollmesh_up(tmp_path, env) as addrs:
        block = bash_block("## Through `rollmesh up`, with an API key", DOC)
        done = run_block(block, addrs, tmp_path, {**env, "RUNS": str(tmp_path)}, cwd=REPO, timeout_s=600)
        assert done.returncode == 0, done.stderr[-4000:]
    rows = _rows(tmp_path, "via-up")
    assert len(rows) == 2 * ROWS and all(r["reward"] == 1.0 for r in rows.values())
    assert all(r["agent_program"]["calls"] == 3 for r in rows.values())
    _valid_with_text(rows)


def test_a_warm_started_program_and_an_agent_server(tmp_path: Path) -> None:
    block = bash_block("## Faster: agent servers and warm starts", DOC)
    done = run_block(block, {}, tmp_path, {"RUNS": str(tmp_path)}, cwd=REPO, timeout_s=600)
    assert done.returncode == 0, done.stderr[-4000:]
    warm, server = _rows(tmp_path, "warm"), _rows(tmp_path, "server")
    assert len(warm) == len(server) == 2 * ROWS
    for mode, rows in (("warm", warm), ("server", server)):
        for key, row in rows.items():
            run = row["agent_program"]
            assert row["reward"] == 1.0 and run["mode"] == mode, key
            assert (run["exit_code"], run["calls"], run["tool_calls"], run["segments"]) == (0, 3, 2, 1)
            assert run["sandbox"] == ("uid+mount+pid+network" if os.geteuid() == 0 else "limits")
            assert row["tokens"]["logprobs_recorded"] is True and len(row["tokens"]["turns"]) == 3
            # The same loop, the same seeds: the same records whichever way it ran.
            assert row["tokens"] == warm[key]["tokens"], key
        _valid_with_text(rows)
