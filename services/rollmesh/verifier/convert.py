"""Proto <-> domain conversions for the verifier (with servicer.py, the only modules that see *_pb2)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from rollmesh.mesh.chat import message_from_pb
from rollmesh.mesh.chat import message_to_pb
from rollmesh.mesh.chat import tool_spec_to_pb
from rollmesh.mesh.fields import from_pb
from rollmesh.mesh.fields import to_pb
from rollmesh.verifier.environment import EnvTurn
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import ToolOutput
from rollmesh.verifier.environment import VerifyResult
from rollmesh.verifier.loader import Broken
from rollmesh.verifier.service import EnvironmentInfo
from rollmesh.verifier.service import GroupCall
from rollmesh.verifier.service import GroupMember
from rollmesh.verifier.service import SeededSession
from rollmesh.verifier.service import VerifyCall
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import verifier_pb2 as pb


def environment_to_pb(info: EnvironmentInfo) -> pb.Environment:
    return to_pb(pb.Environment, info, tools=[tool_spec_to_pb(t) for t in info.tools])


def broken_to_pb(item: Broken) -> pb.BrokenEnvironment:
    return to_pb(pb.BrokenEnvironment, item)


def response_from_pb(messages: Iterable[common_pb2.ChatMessage]) -> Response:
    return Response(tuple(message_from_pb(m) for m in messages))


def verify_call_from_pb(req: pb.VerifyRequest) -> VerifyCall:
    return from_pb(VerifyCall, req, response=response_from_pb(req.response.messages))


def group_call_from_pb(req: pb.VerifyGroupRequest) -> GroupCall:
    members = tuple(GroupMember(response_from_pb(m.response.messages), m.session_id) for m in req.members)
    return GroupCall(req.environment, req.task_json, members)


def seeded_to_pb(seeded: SeededSession, ttl_s: float) -> pb.SeedSessionResponse:
    return pb.SeedSessionResponse(
        session_id=seeded.session.id,
        tools=[tool_spec_to_pb(t) for t in seeded.tools],
        ttl_seconds=ttl_s,
        messages=[message_to_pb(m) for m in seeded.messages],
        takes_turns=seeded.takes_turns,
        session_tools=[tool_spec_to_pb(t) for t in seeded.session_tools],
    )


def env_turn_to_pb(turn: EnvTurn) -> pb.StepResponse:
    return pb.StepResponse(
        messages=[message_to_pb(m) for m in turn.messages],
        reward=turn.reward,
        done=turn.done,
        info_json=json.dumps(dict(turn.info)) if turn.info else "",
    )


def tool_output_to_pb(out: ToolOutput) -> pb.CallToolResponse:
    return pb.CallToolResponse(
        tool_call_id=out.call_id, output=out.output, is_error=out.is_error, ends_agent=out.ends_agent
    )


def result_to_pb(result: VerifyResult) -> pb.VerifyResult:
    return pb.VerifyResult(
        reward=float(result.reward),
        components={k: float(v) for k, v in result.components.items()},
        extracted_answer=result.extracted_answer,
        details_json=json.dumps(result.details, default=repr),
        masked=result.masked,
    )
