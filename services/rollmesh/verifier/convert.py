"""Proto <-> domain conversions for the verifier (with servicer.py, the only modules that see *_pb2)."""

from __future__ import annotations

import json

from rollmesh.mesh.chat import message_from_pb, tool_spec_to_pb
from rollmesh.verifier.environment import Response, ToolOutput, VerifyResult
from rollmesh.verifier.loader import Broken
from rollmesh.verifier.service import EnvironmentInfo, VerifyCall
from rollmesh_client.v1 import verifier_pb2 as pb


def environment_to_pb(info: EnvironmentInfo) -> pb.Environment:
    return pb.Environment(
        name=info.name,
        description=info.description,
        tools=[tool_spec_to_pb(t) for t in info.tools],
        source=info.source,
        example_dataset=info.example_dataset,
        stateless=info.stateless,
        sandbox=info.sandbox,
    )


def broken_to_pb(item: Broken) -> pb.BrokenEnvironment:
    return pb.BrokenEnvironment(name=item.name, source=item.source, error=item.error)


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
