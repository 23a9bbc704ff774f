"""Rollout health checks (scheduler/health.py): each finding on a conversation built to have it (and
a healthy one with none); a job whose model answers empty strings for some tasks, loops for others
and writes unparsed tool-call text for a third kind gets those findings, by key, in metrics.json and
from `rollmesh health` (which also checks the context limit when told it)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.health import findings
from rollmesh.scheduler.health import repeats
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.manager import JobRecord
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.store import METRICS
from rollmesh_client.v1 import gateway_pb2
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import Rows
from tests.fakes import solve

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])
LOOP = "The answer is 4. " * 12
MARKUP = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>'


def _assistant(content: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "increment", "arguments": "{}"}}


def test_each_finding_and_a_healthy_rollout_with_none() -> None:
    healthy = [
        _assistant("", [_call("a")]),
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        _assistant("1"),
    ]
    assert findings(healthy, "stop") == {}
    assert findings([_assistant("  \n")], "stop") == {"empty_turn": 1}
    assert findings([_assistant("4")], "length") == {"cut_at_max_tokens": 1}
    assert findings([_assistant("", [_call("a")]), _assistant("done")], "stop") == {"unanswered_tool_call": 1}
    assert findings([_assistant("ok"), _assistant(LOOP)], "stop") == {"repeated_output": 2}
    same = [_assistant("", [_call("x")]), {"role": "tool", "tool_call_id": "x", "content": "?"}]
    assert findings(same * 3, "max_steps") == {"repeated_output": 3}
    assert findings([_assistant(f"Let me compute. {MARKUP}")], "stop") == {"unparsed_tool_call": 1}
    assert findings([_assistant("4")], "stop", [100, 950], context_length=1000) == {"near_context_limit": 2}
    assert findings([_assistant("4")], "stop", [100, 890], context_length=1000) == {}


def test_repeats_wants_a_long_enough_run_of_one_piece() -> None:
    assert repeats("a" * 40) and repeats("x" + "ab" * 20) and repeats("intro. " + "the same line\n" * 4)
    assert not repeats("a" * 39) and not repeats("the same line\n" * 3) and not repeats("   " * 40)
    assert not repeats("The answer is 4, because 2 + 2 = 4 and nothing else is 4.")


def _bad_model(req: gateway_pb2.GenerateRequest, turn: int) -> dict[str, Any]:
    """Task i: i % 4 == 0 an empty answer, 1 a loop, 2 unparsed tool-call text, 3 the right answer."""
    question = next(m.content for m in req.messages if m.role == "user")
    i = int(re.findall(r"\d+", question)[0])
    return {"content": ["", LOOP, MARKUP, solve(question)][i % 4]}


async def _bad_job(tmp_path: Path) -> JobRecord:
    path = Rows.arithmetic(8).write(tmp_path / "d.jsonl")
    mgr = JobManager(CATALOG, model=LocalModel(_bad_model), env=LocalEnv(), output_dir=str(tmp_path))
    try:
        spec = JobSpec(dataset=str(path), environment="arithmetic", num_repeats=2, output_dir=str(tmp_path))
        return await mgr.wait((await mgr.submit(spec)).job_id)
    finally:
        await mgr.aclose()


def test_a_bad_models_job_names_each_problem_its_count_and_keys(tmp_path: Path) -> None:
    rec = asyncio.run(_bad_job(tmp_path))  # (the CLI below runs its own event loop)
    assert rec.state == "SUCCEEDED"  # every rollout ran and was scored: health is apart from that
    health = json.loads((rec.directory / METRICS).read_text())["health"]
    assert health["checked"] == 16
    assert health["findings"] == {
        "empty_turn": 4,
        "cut_at_max_tokens": 0,
        "unanswered_tool_call": 0,
        "repeated_output": 4,
        "unparsed_tool_call": 4,
    }
    assert health["share"]["empty_turn"] == 0.25
    assert health["keys"]["empty_turn"] == ["0:0", "0:1", "4:0", "4:1"]
    assert health["keys"]["repeated_output"] == ["1:0", "1:1", "5:0", "5:1"]
    assert "near_context_limit" in health["not_checked"]

    result = CliRunner().invoke(
        build_app(), ["health", str(rec.directory), "--json", "--context-length", "64"]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    by_key = {r["key"]: r["findings"] for r in shown["rollouts"]}
    # 64 tokens: the long answers (the loops and the tool-call text) reach 90% of it, no other.
    assert shown["not_checked"] == {} and shown["findings"]["near_context_limit"] == 8
    assert by_key["2:1"] == {"unparsed_tool_call": 1, "near_context_limit": 1}
    assert by_key["0:0"] == {"empty_turn": 1} and "3:0" not in by_key and len(by_key) == 12
    table = CliRunner().invoke(build_app(), ["health", str(rec.directory)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "repeated_output" in table.stdout and "25.0%" in table.stdout
    assert "not checked: near_context_limit" in table.stderr


def test_a_rows_findings_come_from_its_turns_in_each_row_format() -> None:
    """`rollmesh health` reads rows as every results command does: a row rollmesh writes (turns in
    `chat_messages`, the finish reason beside them), one written before (both inside `response`) and
    NeMo Gym's (the turns as Responses items, the finish reason from `status`) give the same findings."""
    from rollmesh.mesh.chat import Message
    from rollmesh.mesh.responses_items import items_from_messages
    from rollmesh.scheduler.health import of_row
    from rollmesh.scheduler.records import Rollout
    from rollmesh.scheduler.records import RolloutKey

    turns = [_assistant("", [_call("c1")]), _assistant("")]  # a call never answered, an empty turn
    want = {"empty_turn": 2, "unanswered_tool_call": 1, "cut_at_max_tokens": 2}
    ours = Rollout(RolloutKey(0, 0), "j", {}, turns, 0.0, finish_reason="length").to_row()
    older = {
        "task_index": 0,
        "rollout_index": 0,
        "reward": 0.0,
        "response": {"output": turns, "finish_reason": "length"},
    }
    output = items_from_messages(Message.from_openai(m) for m in turns)
    nemo_gym = {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "reward": 0.0,
        "response": {
            "output": output,
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
        },
    }
    assert of_row(ours) == of_row(older) == of_row(nemo_gym) == want


def test_findings_come_in_their_order_and_tool_calls_are_checked_against_every_tool_result() -> None:
    """Found in another order than FINDINGS lists them, they come in FINDINGS' order; a tool result
    anywhere in the output answers a call (before it too); a turn that only calls tools is not empty,
    one whose `tool_calls` is empty is; three turns of the same calls in a row repeat."""
    many = [_assistant(""), _assistant(f"{MARKUP} " + LOOP), _assistant("", [_call("z")])]
    found = findings(many, "length", [10, 20, 990], context_length=1000)
    assert list(found.items()) == [
        ("empty_turn", 1),
        ("cut_at_max_tokens", 3),
        ("unanswered_tool_call", 3),
        ("repeated_output", 2),
        ("unparsed_tool_call", 2),
        ("near_context_limit", 3),
    ]
    answered_first = [{"role": "tool", "tool_call_id": "a", "content": "1"}, _assistant("", [_call("a")])]
    assert findings(answered_first, "stop") == {}
    assert findings([{"role": "assistant", "content": "", "tool_calls": []}], "stop") == {"empty_turn": 1}
    assert findings([_assistant("", [_call("a"), _call("b")])], "stop") == {"unanswered_tool_call": 1}
    same = [_assistant("again", [_call("x")]), {"role": "tool", "tool_call_id": "x", "content": "?"}]
    assert findings(same * 2, "stop") == {} and findings(same * 3, "stop") == {"repeated_output": 3}
