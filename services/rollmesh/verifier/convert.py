"""Proto <-> domain conversions for the verifier (with servicer.py, the only modules that see *_pb2)."""

from __future__ import annotations

import json

from rollmesh.mesh.chat import message_from_pb, tool_spec_to_pb
from rollmesh.mesh.fields import from_pb, to_pb
from rollmesh.verifier.environment import Response, ToolOutput, VerifyResult
from rollmesh.verifier.loader import Broken
from rollmesh.verifier.service import EnvironmentInfo, VerifyCall
from rollmesh_client.v1 import verifier_pb2 as pb


def environment_to_pb(info: EnvironmentInfo) -> pb.Environment:
    return to_pb(pb.Environment, info, tools=[tool_spec_to_pb(t) for t in info.tools])


def broken_to_pb(item: Broken) -> pb.BrokenEnvironment:
    return to_pb(pb.BrokenEnvironment, item)


def verify_call_from_pb(req: pb.VerifyRequest) -> VerifyCall:
    return from_pb(
        VerifyCall, req, response=Response(tuple(message_from_pb(m) for m in req.response.messages))
    )


def tool_output_to_pb(out: ToolOutput) -> pb.CallToolResponse:
    return pb.CallToolResponse(tool_call_id=out.call_id, output=out.output, is_error=out.is_error)


def result_to_pb(result: VerifyResult) -> pb.VerifyResult:
    return pb.VerifyResult(
        reward=float(result.reward),
        components={k: float(v) for k, v in result.components.items()},
        extracted_answer=result.extracted_answer,
        details_json=json.dumps(result.details, default=repr),
    )
