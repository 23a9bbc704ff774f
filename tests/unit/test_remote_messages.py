"""scheduler/remote.py names the fields of its hottest conversions (a model turn's request and Turn,
a verdict) instead of copying every same-named field with mesh/fields.py: each gives what the copy
by name gives, with every field of both sides set, so a field added to both is not left behind."""

from __future__ import annotations

import json
import math

import pytest
from google.protobuf.message import Message

from rollmesh.mesh import tracing
from rollmesh.mesh.fields import from_pb
from rollmesh.mesh.fields import to_pb
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.mesh.versions import spans_from
from rollmesh.scheduler.convert import message_from_pb
from rollmesh.scheduler.convert import message_to_pb
from rollmesh.scheduler.convert import sampling_to_pb
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.remote import generate_request
from rollmesh.scheduler.remote import tool_to_pb
from rollmesh.scheduler.remote import turn_of
from rollmesh.scheduler.remote import verdict_of
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import verifier_pb2

_CALLS = [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]


def _by_copy(call: GenerateCall) -> gateway_pb2.GenerateRequest:
    return to_pb(
        gateway_pb2.GenerateRequest,
        call,
        messages=[message_to_pb(m) for m in call.messages],
        tools=[tool_to_pb(t) for t in call.tools],
        sampling=sampling_to_pb(call.sampling),
        trace_context=tracing.inject() or None,
    )


@pytest.mark.parametrize(
    "call",
    [
        GenerateCall(
            model="Qwen/Qwen3-0.6B",
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "What is 2 + 2? ☃"},
                {"role": "assistant", "content": "", "reasoning_content": "add", "tool_calls": _CALLS},
                {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "4"},
            ],
            tools=[{"name": "add", "description": "adds", "parameters": {"type": "object"}}],
            sampling={"temperature": 0.7, "top_p": 0.9, "max_tokens": 64, "seed": 3, "stop": ["\n\n"]},
            session_id="job/1/2",
            request_id="job/1/2/0",
        ),
        GenerateCall(model="", messages=[], tools=[], sampling={}, session_id="", request_id=""),
    ],
)
def test_a_model_turns_request_is_the_copy_by_name(call: GenerateCall) -> None:
    mine = generate_request(call)
    assert mine == _by_copy(call)
    assert mine.SerializeToString(deterministic=True) == _by_copy(call).SerializeToString(deterministic=True)


def _full_response() -> gateway_pb2.GenerateResponse:
    """A response with every field set (a field the message gains and this leaves unset is caught by
    the check below)."""
    resp = gateway_pb2.GenerateResponse(
        message=common_pb2.ChatMessage(
            role="assistant",
            content="4",
            tool_calls=[common_pb2.ToolCall(id="c1", name="add", arguments_json='{"a": 1}')],
            reasoning="think",
        ),
        prompt_token_ids=[1, 2, 3],
        output_token_ids=[4, 5],
        logprobs=[-0.5, -0.25],
        finish_reason="tool_calls",
        replica_id="replica-1",
        policy_version="v3",
        model="m",
        request_id="job/1/2/0",
        reused_prefix_tokens=2,
        first_token_s=0.125,
        versions=[
            common_pb2.VersionSpan(start=0, end=1, policy_version="v3"),
            common_pb2.VersionSpan(start=1, end=2, policy_version="v4"),
        ],
    )
    resp.usage.prompt_tokens = 3
    resp.usage.completion_tokens = 2
    return resp


def test_every_field_of_the_full_response_is_set() -> None:
    assert _unset(_full_response()) == []
    assert _unset(_FULL_RESULT) == []


def _unset(msg: Message) -> list[str]:
    given = {f.name for f, _ in msg.ListFields()}
    return [f.name for f in msg.DESCRIPTOR.fields if f.name not in given]


_FULL_RESULT = verifier_pb2.VerifyResult(
    reward=0.5,
    components={"correct": 1.0, "format": 0.0},
    extracted_answer="4",
    details_json=json.dumps({"expected": "4", "why": ["a", 1]}),
    masked=True,
)


@pytest.mark.parametrize("resp", [_full_response(), gateway_pb2.GenerateResponse()], ids=["full", "empty"])
def test_a_turn_is_the_copy_by_name(resp: gateway_pb2.GenerateResponse) -> None:
    expected = from_pb(
        Turn,
        resp,
        message=message_from_pb(resp.message),
        versions=spans_from(resp.versions),
        prompt_tokens=resp.usage.prompt_tokens,
        completion_tokens=resp.usage.completion_tokens,
    )
    turn = turn_of(resp)
    assert turn == expected
    assert type(turn.prompt_token_ids) is list and type(turn.logprobs) is list
    assert type(turn.versions) is tuple


@pytest.mark.parametrize(
    "result",
    [
        _FULL_RESULT,
        verifier_pb2.VerifyResult(reward=math.nan, components={"x": math.inf}),
        verifier_pb2.VerifyResult(),
    ],
    ids=["full", "not-finite", "empty"],
)
def test_a_verdict_is_the_copy_by_name(result: verifier_pb2.VerifyResult) -> None:
    expected = from_pb(
        VerifyResult, result, details=json.loads(result.details_json) if result.details_json else {}
    )
    mine = verdict_of(result)
    assert repr(mine) == repr(expected)  # (repr: NaN != NaN)
    assert mine.not_finite() == expected.not_finite()
    assert type(mine.components) is dict
