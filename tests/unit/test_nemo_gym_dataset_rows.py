"""NeMo Gym dataset rows read at the edge as they are (scheduler/drivers/agent_loop.py `input_messages`,
scheduler/plan.py): an `input` that continues an episode (reasoning, function_call and
function_call_output items, as single_step_tool_use_with_argument_comparison's rows hold) and
`instructions` (google_search's rows). The first were refused at submit ("not a message with a
`role`"); the second were sent without their system prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.responses_items import messages_from_items
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.drivers.agent_loop import input_messages
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.spec import JobSpec


def rows_of(servers: Path, server: str) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in (servers / server / "data" / "example.jsonl").read_text().splitlines()
    ]


def test_rows_that_continue_an_episode_are_its_turns(nemo_gym_servers: Path, tmp_path: Path) -> None:
    rows = rows_of(nemo_gym_servers, "single_step_tool_use_with_argument_comparison")
    episodes = [
        r
        for r in rows
        if any(m.get("type") == "function_call" for m in r["responses_create_params"]["input"])
    ]
    assert episodes
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plan = build_plan(
        Catalog([Root(BUILTIN_ROOT, 0, "root")]), JobSpec(dataset=str(path), environment="arithmetic")
    )
    assert plan.total == len(rows)
    for row in episodes:
        items = row["responses_create_params"]["input"]
        chat = input_messages(row)
        calls = [c for m in chat for c in m.get("tool_calls", [])]
        assert [c["id"] for c in calls] == [
            it["call_id"] for it in items if it.get("type") == "function_call"
        ]
        outputs = [(m["tool_call_id"], m["content"]) for m in chat if m["role"] == "tool"]
        assert outputs == [
            (it["call_id"], it["output"]) for it in items if it.get("type") == "function_call_output"
        ]
        said = [m["reasoning_content"] for m in chat if "reasoning_content" in m]
        assert said == [
            m.reasoning for m in messages_from_items(items, default_role="user") if m.reasoning is not None
        ]
        assert chat[0]["role"] == "system" and all(m["role"] != "developer" for m in chat)


def test_instructions_are_the_system_message(nemo_gym_servers: Path) -> None:
    row = next(
        r
        for r in rows_of(nemo_gym_servers, "google_search")
        if r["responses_create_params"].get("instructions")
    )
    chat = input_messages(row, "a job's system prompt")
    assert chat[0] == {"role": "system", "content": row["responses_create_params"]["instructions"]}
    assert [m["role"] for m in chat].count("system") == 1  # the row's own wins over the job's


@pytest.mark.parametrize(
    ("params", "said"),
    [
        (
            {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id`: must be a string",
        ),
        (
            {"input": [{"type": "web_search_call"}]},
            "input[0].type`: item type 'web_search_call' is not supported",
        ),
        (
            {"input": "hi", "instructions": ["be brief"]},
            "`responses_create_params.instructions` must be a string",
        ),
    ],
)
def test_items_that_cannot_be_read_name_the_row(tmp_path: Path, params: dict[str, Any], said: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"responses_create_params": params}) + "\n")
    with pytest.raises(RollmeshError, match=r"d\.jsonl:1") as info:
        build_plan(
            Catalog([Root(BUILTIN_ROOT, 0, "root")]), JobSpec(dataset=str(path), environment="arithmetic")
        )
    assert said in info.value.message and info.value.reason == "MALFORMED_DATASET_ROW"
