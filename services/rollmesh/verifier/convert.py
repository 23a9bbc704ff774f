"""Proto <-> domain conversions for the verifier (with servicer.py, the only modules that see *_pb2)."""

from __future__ import annotations

import json

from rollmesh.verifier.environment import Message, Response, ToolCall, ToolOutput, ToolSpec, VerifyResult
from rollmesh.verifier.loader import Broken
from rollmesh.verifier.service import EnvironmentInfo, VerifyCall
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import verifier_pb2 as pb


def tool_spec_to_pb(spec: ToolSpec) -> common_pb2.ToolSpec:
    return common_pb2.ToolSpec(
        name=spec.name, description=spec.description, parameters_json=json.dumps(spec.parameters)
    )


def environment_to_pb(info: EnvironmentInfo) -> pb.Environment:
    return pb.Environment(
        name=info.name,
        description=info.description,
        tools=[tool_spec_to_pb(t) for t in info.tools],
        source=info.source,
        example_dataset=info.example_dataset,
        stateless=info.stateless,
    )


def broken_to_pb(item: Broken) -> pb.BrokenEnvironment:
    return pb.BrokenEnvironment(name=item.name, source=item.source, error=item.error)


def tool_call_from_pb(call: common_pb2.ToolCall) -> ToolCall:
    return ToolCall(id=call.id, name=call.name, arguments_json=call.arguments_json)


def message_from_pb(msg: common_pb2.ChatMessage) -> Message:
    return Message(
        role=msg.role,
        content=msg.content,
        tool_calls=tuple(tool_call_from_pb(c) for c in msg.tool_calls),
        tool_call_id=msg.tool_call_id,
        name=msg.name,
    )


def response_from_pb(resp: pb.ModelResponse) -> Response:
    return Response(tuple(message_from_pb(m) for m in resp.messages))


def verify_call_from_pb(req: pb.VerifyRequest) -> VerifyCall:
    return VerifyCall(
        environment=req.environment,
        task_json=req.task_json,
        response=response_from_pb(req.response),
        session_id=req.session_id,
    )


def tool_output_to_pb(out: ToolOutput) -> pb.CallToolResponse:
    return pb.CallToolResponse(tool_call_id=out.call_id, output=out.output, is_error=out.is_error)


def _jsonable(value: object) -> object:
    return repr(value)


def result_to_pb(result: VerifyResult) -> pb.VerifyResult:
    return pb.VerifyResult(
        reward=float(result.reward),
        components={k: float(v) for k, v in result.components.items()},
        extracted_answer=result.extracted_answer,
        details_json=json.dumps(result.details, default=_jsonable),
    )
