"""The EnvironmentVerifier grpc.aio servicer: proto in, domain call, proto out."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

from rollmesh.mesh import chat
from rollmesh.mesh import tracing
from rollmesh.mesh.errors import InvalidArgument
from rollmesh.mesh.multiplex import Item
from rollmesh.mesh.multiplex import ItemMessages
from rollmesh.mesh.multiplex import MultiplexedMethod
from rollmesh.mesh.paging import page
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.verifier import convert
from rollmesh.verifier.service import VerifierService
from rollmesh_client.v1 import verifier_pb2 as pb
from rollmesh_client.v1 import verifier_pb2_grpc as pb_grpc


class VerifierServicer(pb_grpc.EnvironmentVerifierServicer):
    def __init__(self, service: VerifierService) -> None:
        self._svc = service

    async def ListEnvironments(
        self, request: pb.ListEnvironmentsRequest, context: Any
    ) -> pb.ListEnvironmentsResponse:
        infos, broken = self._svc.list_environments()
        items, token = page(infos, request.page_size, request.page_token)
        first = not request.page_token
        return pb.ListEnvironmentsResponse(
            environments=[convert.environment_to_pb(i) for i in items],
            broken=[convert.broken_to_pb(b) for b in broken] if first else [],
            next_page_token=token,
        )

    async def GetEnvironment(self, request: pb.GetEnvironmentRequest, context: Any) -> pb.Environment:
        return convert.environment_to_pb(self._svc.describe(request.name))

    async def SeedSession(self, request: pb.SeedSessionRequest, context: Any) -> pb.SeedSessionResponse:
        seeded = await self._svc.seed_session(request.environment, request.task_json, request.session_id)
        return convert.seeded_to_pb(seeded, self._svc.sessions.ttl_s)

    async def CallTool(self, request: pb.CallToolRequest, context: Any) -> pb.CallToolResponse:
        if not request.HasField("call") or not request.call.name:
            raise InvalidArgument("CallToolRequest.call.name is required")
        out = await self._svc.call_tool(request.session_id, chat.tool_call_from_pb(request.call))
        return convert.tool_output_to_pb(out)

    async def Step(self, request: pb.StepRequest, context: Any) -> pb.StepResponse:
        turn = await self._svc.step(request.session_id, convert.response_from_pb(request.messages))
        return convert.env_turn_to_pb(turn)

    async def Verify(self, request: pb.VerifyRequest, context: Any) -> pb.VerifyResponse:
        result = await self._svc.verify(convert.verify_call_from_pb(request))
        return pb.VerifyResponse(result=convert.result_to_pb(result))

    async def VerifyGroup(self, request: pb.VerifyGroupRequest, context: Any) -> pb.VerifyGroupResponse:
        results = await self._svc.verify_group(convert.group_call_from_pb(request))
        return pb.VerifyGroupResponse(results=[convert.result_to_pb(r) for r in results])

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any) -> pb.CloseSessionResponse:
        await self._svc.close_session(request.session_id)
        return pb.CloseSessionResponse()

    def verify_batch(self) -> MultiplexedMethod[VerifyResult]:
        """VerifyBatch's server side, which the embedded mesh also runs in-process (in_process.py):
        each item is `verify` of its call, at most the service's `batch_concurrency` at once, in
        completion order; a per-item failure is that item's answer (mesh/multiplex.py)."""
        messages = ItemMessages("verify", pb.VerifyBatchResponse, "result", convert.result_to_pb)
        return MultiplexedMethod(self._batch_item, messages, self._svc.config.batch_concurrency)

    def _batch_item(self, req: pb.VerifyBatchRequest) -> Item[VerifyResult]:
        work = functools.partial(self._svc.verify, convert.verify_call_from_pb(req.request))
        if not req.request.trace_context:  # (the common case: not in a sampled trace)
            return Item(req.id, work)
        attributes = {
            **tracing.rpc("rollmesh.v1.EnvironmentVerifier", "Verify"),
            "rollmesh.environment": req.request.environment,
        }
        traced = tracing.within(
            "verifier.verify", req.request.trace_context, work, attributes, _verdict_attributes
        )
        return Item(req.id, traced)

    async def VerifyBatch(
        self, request_iterator: AsyncIterator[pb.VerifyBatchRequest], context: Any
    ) -> AsyncIterator[pb.VerifyBatchResponse]:
        async for message in self.verify_batch().serve(request_iterator, context):
            yield message


def _verdict_attributes(result: VerifyResult) -> dict[str, Any]:
    return {"rollmesh.reward": result.reward, "rpc.grpc.status_code": 0}
