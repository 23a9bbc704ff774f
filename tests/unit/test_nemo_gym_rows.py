"""NeMo Gym's rollout files both ways (scheduler/records.py): `aggregate`, `profile` and `reverify`
read NeMo Gym's own recorded rollouts (0.4.0's example_rollouts.jsonl, via the nemo_gym_servers
fixture), and the rows rollmesh writes carry what NeMo Gym's tools read (`response` a Responses
object, `_ng_task_index` / `_ng_rollout_index` the rollout's own key) beside rollmesh's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.commands._reverify import verify_request
from rollmesh.mesh import responses_items
from rollmesh.mesh.chat import Message
from rollmesh.scheduler.errors import CorruptSinkFile
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.metrics import task_profile
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import RowKeys
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.store import load_files
from rollmesh.scheduler.store import read_rollout_rows

runner = CliRunner()

# Files NeMo Gym ships under the name that hold no rollout rows: git-lfs placeholders ("<PLACEHOLDER
# ROW>"), copies of the input rows (no response, no reward), rows of failed rollouts (an `error`,
# no reward: 0.7.0's deepsearchqa) and rows of another shape (0.7.0's bbq: no input, no key).
NOT_ROLLOUTS = {
    "bbq": "no task_index/rollout_index",
    "deepsearchqa": "the row has no reward",
    "browsecomp_advanced_harness": "not valid JSON",
    "jailbreak_detection": "not valid JSON",
    "over_refusal_detection": "not valid JSON",
    "tavily_search": "not valid JSON",
    "genrm_compare": "the row has no reward",
    "multichallenge": "the row has no reward",
}


def recorded(servers: Path) -> list[Path]:
    return sorted(servers.glob("*/data/example_rollouts.jsonl"))


def test_every_rollout_file_nemo_gym_recorded_reads_as_results(nemo_gym_servers_each: Path) -> None:
    """What `aggregate` and `profile` load and compute, file by file: NeMo Gym's rollouts as NeMo Gym
    keyed them (a key recorded twice counts once), or one task per prompt where it recorded no key."""
    files = recorded(nemo_gym_servers_each)
    assert len(files) > 80
    for path in files:
        server = path.parts[-3]
        if server in NOT_ROLLOUTS:
            with pytest.raises(CorruptSinkFile, match=NOT_ROLLOUTS[server]):
                load_files([path])
            continue
        loaded = load_files([path])
        keys = RowKeys()
        firsts: dict[tuple[Any, ...], dict[str, Any]] = {}
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row in map(keys.fill, rows):
            firsts.setdefault((row["_ng_task_index"], row["_ng_rollout_index"]), row)
        measured = [r["reward"] for r in firsts.values() if not r.get("mask_sample")]
        m = compute(loaded.rollouts)
        assert (m.num_rollouts, loaded.duplicates, m.num_masked) == (
            len(firsts),
            len(rows) - len(firsts),
            len(firsts) - len(measured),
        ), server
        assert m.mean_reward == pytest.approx(sum(measured) / len(measured) if measured else 0.0), server
        assert sum(t.num_rollouts for t in task_profile(loaded.rollouts)) == len(measured), server


@pytest.mark.parametrize(
    "server", ["code_gen", "example_tool_call_multireward", "graphwalks", "multichallenge"]
)  # no key recorded; keys; a key recorded twice; input rows, not rollouts
def test_aggregate_and_profile_commands_read_nemo_gyms_files(nemo_gym_servers: Path, server: str) -> None:
    path = nemo_gym_servers / server / "data" / "example_rollouts.jsonl"
    res = runner.invoke(build_app(), ["aggregate", str(path), "--json"])
    prof = runner.invoke(build_app(), ["profile", str(path)])
    if server in NOT_ROLLOUTS:
        assert res.exit_code == prof.exit_code == 2 and NOT_ROLLOUTS[server] in res.stderr, res.stderr
        return
    assert res.exit_code == prof.exit_code == 0, (res.stderr, prof.stderr)
    loaded = load_files([path])
    assert json.loads(res.stdout)["mean_reward"] == pytest.approx(compute(loaded.rollouts).mean_reward)
    assert [json.loads(line) for line in prof.stdout.splitlines()] == [
        t.to_json() for t in task_profile(loaded.rollouts)
    ]


def test_a_row_without_a_key_is_keyed_by_its_task_and_the_order_of_its_rollouts() -> None:
    def row(prompt: str) -> dict[str, Any]:
        return {"responses_create_params": {"input": prompt}, "response": None, "reward": 0.0}

    keys = RowKeys()
    got = [keys.fill(row(p)) for p in ("a", "b", "a", "c", "b")]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in got] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (2, 0),
        (1, 1),
    ]
    keyed = {**row("a"), "_ng_task_index": 7, "_ng_rollout_index": 3}
    assert keys.fill(keyed) is keyed and Rollout.from_row(keyed).key == RolloutKey(7, 3)
    assert keys.fill({"reward": 1}) == {"reward": 1}  # not a NeMo Gym row: from_row says what it lacks


def test_reverify_sends_the_recorded_task_and_the_responses_turns(nemo_gym_servers: Path) -> None:
    path = nemo_gym_servers / "example_tool_call_multireward" / "data" / "example_rollouts.jsonl"
    for _, row in read_rollout_rows(path):
        req = verify_request(row, "env")
        task = json.loads(req.task_json)
        assert "response" not in task and "reward" not in task and "_ng_task_index" not in task
        assert task["responses_create_params"] == row["responses_create_params"]
        sent = [m.role for m in req.response.messages]
        assert sent == [m.role for m in responses_items.response_messages(row["response"])] and sent


def test_a_row_rollmesh_writes_is_a_nemo_gym_row_and_reads_back_whole() -> None:
    task = {
        "responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]},
        "_ng_task_index": 0,  # a NeMo Gym materialized input: its keys are NeMo Gym's, not this rollout's
        "_ng_rollout_index": 0,
        "agent_ref": {"name": "math_simple_agent"},
    }
    messages = [
        {"role": "assistant", "content": "", "reasoning_content": "add", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
        ]},
        {"role": "tool", "content": "4", "tool_call_id": "c1"},
        {"role": "assistant", "content": "4"},
    ]  # fmt: skip
    r = Rollout(
        RolloutKey(3, 1), "job", task, messages, 1.0, tokens=TokenRecord([1, 2], [0, 1], [0.0, -0.1]),
        prompt_tokens=9, completion_tokens=4, finish_reason="stop", model="tiny",
    )  # fmt: skip
    row = r.to_row()
    assert (row["_ng_task_index"], row["_ng_rollout_index"]) == (3, 1)  # the rollout's own key
    assert (row["task_index"], row["rollout_index"], row["agent_ref"]) == (3, 1, task["agent_ref"])
    response = row["response"]
    assert [it["type"] for it in response["output"]] == [
        "reasoning", "function_call", "function_call_output", "message",
    ]  # fmt: skip
    assert responses_items.output_text(response["output"]) == "4" and response["status"] == "completed"
    assert (response["model"], response["usage"]["input_tokens"], response["usage"]["output_tokens"]) == (
        "tiny",
        9,
        4,
    )
    assert row["chat_messages"] == messages and row["tokens"]["token_ids"] == [1, 2]
    # the row's response (built from the chat dicts) is byte for byte the one built through Messages
    items = responses_items.items_from_messages([Message.from_openai(m) for m in messages])
    through_messages = responses_items.response_object(
        items, response_id="resp_job_3_1", model="tiny", finish_reason="stop", input_tokens=9, output_tokens=4
    )
    assert json.dumps(response) == json.dumps(through_messages)
    back = Rollout.from_row(json.loads(json.dumps(row)))
    # everything reads back; the task's own _ng_ keys were NeMo Gym's for the input, not kept
    assert back == Rollout(
        **{**r.__dict__, "task": {k: v for k, v in task.items() if not k.startswith("_ng_")}}
    )


def test_rows_written_before_the_responses_object_still_read() -> None:
    old = {
        "task_index": 0,
        "rollout_index": 2,
        "response": {"output": [{"role": "assistant", "content": "4"}], "finish_reason": "length"},
        "reward": 0.0,
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    r = Rollout.from_row(old)
    assert (r.messages, r.finish_reason, r.completion_tokens) == (
        [{"role": "assistant", "content": "4"}],
        "length",
        1,
    )


@pytest.mark.parametrize(
    ("status", "details", "finish"),
    [
        ("completed", None, "stop"),
        ("incomplete", {"reason": "max_output_tokens"}, "length"),
        (None, None, "unknown"),
    ],
)
def test_a_nemo_gym_rows_finish_reason_and_usage_come_from_its_response(
    status: str | None, details: Any, finish: str
) -> None:
    row = {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "responses_create_params": {"input": "hi"},
        "response": {
            "output": [
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}
            ],
            "status": status,
            "incomplete_details": details,
            "usage": {"input_tokens": 5, "output_tokens": 2},
        },
        "reward": 1,
        "extracted_answer": None,
    }
    r = Rollout.from_row(row)
    assert (r.finish_reason, r.prompt_tokens, r.completion_tokens, r.extracted_answer) == (finish, 5, 2, "")
    assert r.messages == [{"role": "assistant", "content": "x"}] and r.task == {
        "responses_create_params": {"input": "hi"}
    }
