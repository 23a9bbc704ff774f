"""Chat messages <-> OpenAI Responses items (mesh/responses_items.py), on NeMo Gym's own recorded
rollouts and on hand-made turns."""

from __future__ import annotations

import json
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import EasyInputMessage
from openai.types.responses import Response
from openai.types.responses import ResponseFunctionToolCall
from openai.types.responses import ResponseOutputMessage
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_input_item import FunctionCallOutput
from pydantic import BaseModel

from rollmesh.mesh import responses_items as ri
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.chat import message_from_pb
from rollmesh.mesh.chat import message_to_pb


def verified_view(items: Sequence[Any]) -> list[tuple[Any, ...]]:
    """What a NeMo Gym verify reads of a response's output: each item's type in order, a message's
    role and text, a reasoning item's summary text, a call's id, name and arguments, a tool output."""
    view: list[tuple[Any, ...]] = []
    for it in items:
        kind = it.get("type", "message")
        if kind == "message":
            c = it["content"]
            view.append((kind, it.get("role"), c if isinstance(c, str) else "".join(p["text"] for p in c)))
        elif kind == "reasoning":
            view.append((kind, "\n\n".join(s["text"] for s in it["summary"])))
        elif kind == "function_call":
            view.append((kind, it["call_id"], it["name"], it["arguments"]))
        else:
            view.append((kind, it["call_id"], it["output"]))
    return view


_ITEM_MODELS: dict[str, type[BaseModel]] = {
    "assistant": ResponseOutputMessage,
    "message": EasyInputMessage,
    "reasoning": ResponseReasoningItem,
    "function_call": ResponseFunctionToolCall,
    "function_call_output": FunctionCallOutput,
}


def validate(response: dict[str, Any]) -> None:
    """`response` validates as OpenAI's SDK types it. NeMo Gym's NeMoGymResponse is OpenAI's Response
    whose output may also hold input items (a user message, a tool's output): those validate as the
    SDK's input item types, the rest within the Response."""
    for it in response["output"]:
        role = "assistant" if it.get("role") == "assistant" else it["type"]
        _ITEM_MODELS[role].model_validate(it)
    inputs = ("message", "function_call_output")
    outputs = [it for it in response["output"] if it["type"] not in inputs or it.get("role") == "assistant"]
    Response.model_validate({**response, "output": outputs})


def recorded_responses(servers: Path) -> list[tuple[str, dict[str, Any]]]:
    """(server:line, response) of every recorded rollout whose `response` is a Responses object."""
    out = []
    for path in sorted(servers.glob("*/data/example_rollouts.jsonl")):
        for n, line in enumerate(path.read_text().splitlines()):
            try:
                row = json.loads(line)
            except ValueError:  # a few servers ship a git-lfs pointer instead of their rollouts
                continue
            if isinstance(row.get("response"), Mapping):
                out.append((f"{path.parts[-3]}:{n}", row["response"]))
    return out


def test_every_nemo_gym_recorded_response_survives_response_to_messages_to_response(
    nemo_gym_servers_each: Path,
) -> None:
    recorded = recorded_responses(nemo_gym_servers_each)
    assert len(recorded) > 300  # 0.4.0 records ~80 servers x 5 rollouts
    kinds: set[str] = set()
    for where, response in recorded:
        output = response["output"]
        if output and all(isinstance(t, list) for t in output):  # aviary: the last transition
            output = output[-1]
        back = ri.response_object(
            ri.items_from_messages(ri.response_messages(response)),
            response_id="r",
            model="m",
            finish_reason="stop",
        )
        assert verified_view(back["output"]) == verified_view(output), where
        assert ri.output_text(back["output"]) == ri.output_text(output), where
        validate(back)
        kinds.update(it.get("type", "message") for it in output)
    assert kinds == {"message", "reasoning", "function_call", "function_call_output"}


def test_one_turn_is_reasoning_then_text_then_calls_and_out_of_order_items_start_a_new_turn() -> None:
    items = [
        {"type": "message", "role": "user", "content": "add 2 and 3"},
        {"type": "reasoning", "id": "rs_a", "summary": [{"type": "summary_text", "text": "use add"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "calling"}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 3, "b": 2}'},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
        {"type": "function_call_output", "call_id": "c2", "output": "5"},
        {"type": "reasoning", "id": "rs_b", "summary": []},
        {"type": "reasoning", "id": "rs_c", "summary": [{"type": "summary_text", "text": "done"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "5"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "!"}]},
    ]
    msgs = ri.messages_from_items(items)
    assert msgs == [
        Message("user", "add 2 and 3"),
        Message(
            "assistant",
            "calling",
            (ToolCall("c1", "add", '{"a": 2, "b": 3}'), ToolCall("c2", "add", '{"a": 3, "b": 2}')),
            reasoning="use add",
        ),
        Message("tool", "5", tool_call_id="c1"),
        Message("tool", "5", tool_call_id="c2"),
        Message("assistant", reasoning=""),  # a reasoning step without text is kept, empty
        Message("assistant", "5", reasoning="done"),
        Message("assistant", "!"),
    ]
    assert verified_view(ri.items_from_messages(msgs)) == verified_view(items)
    assert [m.to_openai().get("reasoning_content") for m in msgs if m.role == "assistant"] == [
        "use add",
        "",
        "done",
        None,
    ]


def test_a_turn_with_nothing_is_one_empty_text_message_and_calls_get_ids() -> None:
    items = ri.items_from_messages(
        [Message("assistant"), Message("assistant", "", (ToolCall("", "f", "{}"),))]
    )
    assert [(it["type"], it["id"]) for it in items] == [("message", "msg_0"), ("function_call", "fc_1_0")]


@pytest.mark.parametrize(
    ("items", "where", "says"),
    [
        ([{"type": "web_search_call"}], "[0].type", "item type 'web_search_call' is not supported"),
        (["hi"], "[0]", "must be an object, not str"),
        (
            [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "[0].content",
            "only text content parts are supported",
        ),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "[0].call_id", "must be a string"),
        ([{"type": "message", "role": "tool", "content": "x"}], "[0].role", "role 'tool' is not"),
    ],
)
def test_what_is_not_a_readable_item_is_named_never_dropped(items: list[Any], where: str, says: str) -> None:
    with pytest.raises(ri.NotResponsesItem) as exc:
        ri.messages_from_items(items)
    assert exc.value.where == where and says in str(exc.value)


def test_request_input_reads_instructions_strings_and_items_without_a_type() -> None:
    assert ri.messages_from_input("hi", "be brief") == [Message("system", "be brief"), Message("user", "hi")]
    assert ri.messages_from_input([{"content": "hi"}]) == [Message("user", "hi")]
    with pytest.raises(ValueError, match="input must be a string or a list"):
        ri.messages_from_input({"content": "hi"})


@pytest.mark.parametrize(
    ("finish", "status", "details"),
    [
        ("stop", "completed", None),
        ("tool_calls", "completed", None),
        ("length", "incomplete", {"reason": "max_output_tokens"}),
        ("abort", "incomplete", {"reason": None}),
    ],
)
def test_a_finish_reason_is_a_status(finish: str, status: str, details: Any) -> None:
    assert ri.response_status(finish) == (status, details)
    items = ri.items_from_messages([Message("assistant", "x")])
    obj = ri.response_object(items, response_id="r", model="m", finish_reason=finish)
    assert (obj["status"], obj["incomplete_details"]) == (status, details)
    validate(obj)
    assert Response.model_validate(obj).output_text == "x"


@pytest.mark.parametrize("reasoning", [None, "", "think"])
def test_reasoning_crosses_the_wire_with_none_and_empty_apart(reasoning: str | None) -> None:
    m = Message("assistant", "x", reasoning=reasoning)
    assert message_from_pb(message_to_pb(m)) == m
    assert Message.from_openai(m.to_openai()) == m


def test_the_gateways_responses_route_reads_items_here_and_names_the_item_it_refuses() -> None:
    from rollmesh.gateway.errors import InvalidGenerateRequest
    from rollmesh.gateway.http import protocol

    items = [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "greet"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
    ]
    got = protocol.responses_input({}, {"model": "m", "input": items})
    assert got.messages == (Message("user", "hi"), Message("assistant", "hello", reasoning="greet"))
    with pytest.raises(InvalidGenerateRequest) as exc:
        protocol.responses_input({}, {"model": "m", "input": [*items, {"type": "file_search_call"}]})
    assert exc.value.metadata["field"] == "input[3].type"
    assert exc.value.message == "input[3].type: item type 'file_search_call' is not supported"


# Chat dicts as rows hold them, and as other writers send them: every shape `Message.from_openai`
# reads (content parts, None content, calls with the function's fields at the top or arguments as an
# object, calls without ids, vLLM's `reasoning` and `reasoning_content`, empty reasoning, tool
# outputs, user/system turns, several turns).
_CHATS: list[list[dict[str, Any]]] = [
    [],
    [{"role": "assistant", "content": "The answer is 4."}],
    [{"role": "assistant", "content": ""}],
    [{"role": "assistant", "content": None}],
    [{"role": "assistant", "content": "", "reasoning_content": ""}],
    [{"role": "assistant", "content": "x", "reasoning_content": "think\n\nmore"}],
    [{"role": "assistant", "content": "", "reasoning": [{"type": "text", "text": "r"}]}],
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": "calling",
            "reasoning_content": "plan",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}},
                {"id": "", "type": "function", "function": {"name": "calc", "arguments": {"y": [2]}}},
                {"name": "top", "arguments": None},
                "not a call",
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "content": [{"type": "text", "text": "2"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c3", "function": {"name": "f"}}]},
        {"role": "tool", "tool_call_id": "c3", "content": ""},
        {"role": "user", "content": "again", "name": "u"},
        {"role": "assistant", "content": "done", "reasoning_content": None, "reasoning": "late"},
    ],
    [{"role": "developer", "content": 7}, {"content": "no role"}],
]


@pytest.mark.parametrize("chat", _CHATS)
def test_items_from_chat_are_the_message_path_items(chat: list[dict[str, Any]]) -> None:
    # The row's fast path (no Message objects) gives byte-identical items to the path through them.
    fast = ri.items_from_chat(chat)
    slow = ri.items_from_messages(Message.from_openai(m) for m in chat)
    assert json.dumps(fast) == json.dumps(slow)
    assert (fast == []) == (chat == [])


@pytest.mark.parametrize("chat", _CHATS)
def test_a_chat_dict_sent_and_read_as_protobuf_is_the_message_paths(chat: list[dict[str, Any]]) -> None:
    # The scheduler's requests (no Message objects) carry the same bytes as the path through them.
    from rollmesh.mesh.chat import openai_message_from_pb
    from rollmesh.mesh.chat import openai_message_to_pb

    for m in chat:
        fast, slow = openai_message_to_pb(m), message_to_pb(Message.from_openai(m))
        assert fast.SerializeToString(deterministic=True) == slow.SerializeToString(deterministic=True)
        assert fast.HasField("reasoning") == slow.HasField("reasoning")
        # ... and read back (a reply) as the same dict, in the same key order
        back = openai_message_from_pb(fast)
        assert json.dumps(back) == json.dumps(message_from_pb(fast).to_openai())
