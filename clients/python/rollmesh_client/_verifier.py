"""Typed client for the EnvironmentVerifier."""

from __future__ import annotations

import builtins
import json
from collections.abc import AsyncIterator
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from rollmesh_client._base import ServiceClient
from rollmesh_client._errors import RollmeshClientError
from rollmesh_client._errors import from_status
from rollmesh_client._streams import Answers
from rollmesh_client._streams import IdPairs
from rollmesh_client._streams import Multiplexed
from rollmesh_client._streams import call_many
from rollmesh_client._streams import id_pairs
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import verifier_pb2 as pb
from rollmesh_client.v1 import verifier_pb2_grpc as pb_grpc

Task = Mapping[str, Any] | str
# The answer to verify: its final text, the rollout's messages, or a ModelResponse.
ResponseLike = str | Iterable[common_pb2.ChatMessage] | pb.ModelResponse


def _task_json(task: Task) -> str:
    return task if isinstance(task, str) else json.dumps(task)


def _messages(response: ResponseLike) -> pb.ModelResponse:
    if isinstance(response, pb.ModelResponse):
        return response
    if isinstance(response, str):
        return pb.ModelResponse(messages=[common_pb2.ChatMessage(role="assistant", content=response)])
    return pb.ModelResponse(messages=list(response))


def verify_request(
    environment: str, task: Task, response: ResponseLike, *, session_id: str = ""
) -> pb.VerifyRequest:
    """A VerifyRequest for `response` (`ResponseLike`)."""
    return pb.VerifyRequest(
        environment=environment,
        task_json=_task_json(task),
        response=_messages(response),
        session_id=session_id,
    )


VerifyMux = Multiplexed[pb.VerifyBatchRequest, pb.VerifyBatchResponse, pb.VerifyResult]


def _verify_answer(resp: pb.VerifyBatchResponse) -> tuple[str, pb.VerifyResult | RollmeshClientError]:
    return resp.id, (from_status(resp.error) if resp.HasField("error") else resp.result)


def verify_mux(stub: pb_grpc.EnvironmentVerifierStub) -> VerifyMux:
    """`Verify` calls multiplexed over one `VerifyBatch` stream: `await mux.call(request, deadline_s)`."""
    return Multiplexed(
        stub.VerifyBatch,
        make_item=lambda i, req, _deadline_s: pb.VerifyBatchRequest(id=i, request=req),
        read_answer=_verify_answer,
        what="Verify",
    )


class VerifierClient(ServiceClient):
    """Environments, sessions, tool calls and verification. `.stub` is the raw escape hatch."""

    stub_class = pb_grpc.EnvironmentVerifierStub

    async def environments(self, *, page_size: int = 100) -> AsyncIterator[pb.Environment]:
        """Every loaded environment, following page tokens."""
        request = lambda t: pb.ListEnvironmentsRequest(page_size=page_size, page_token=t)  # noqa: E731
        async for env in self._pages(self.stub.ListEnvironments, request, "environments"):
            yield env

    async def list(self, *, page_size: int = 100) -> pb.ListEnvironmentsResponse:
        """One page, with the broken plugins (listed on the first page)."""
        resp: pb.ListEnvironmentsResponse = await self._unary(
            self.stub.ListEnvironments, pb.ListEnvironmentsRequest(page_size=page_size), idempotent=True
        )
        return resp

    async def get(self, name: str) -> pb.Environment:
        env: pb.Environment = await self._unary(
            self.stub.GetEnvironment, pb.GetEnvironmentRequest(name=name), idempotent=True
        )
        return env

    async def seed_session(
        self, environment: str, task: Task, *, session_id: str = ""
    ) -> pb.SeedSessionResponse:
        req = pb.SeedSessionRequest(
            environment=environment, task_json=_task_json(task), session_id=session_id
        )
        resp: pb.SeedSessionResponse = await self._unary(self.stub.SeedSession, req)
        return resp

    async def call_tool(
        self, session_id: str, name: str, arguments: Mapping[str, Any] | str, *, call_id: str = "call_0"
    ) -> pb.CallToolResponse:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        req = pb.CallToolRequest(
            session_id=session_id, call=common_pb2.ToolCall(id=call_id, name=name, arguments_json=args)
        )
        resp: pb.CallToolResponse = await self._unary(self.stub.CallTool, req)
        return resp

    async def step(self, session_id: str, turn: ResponseLike) -> pb.StepResponse:
        """Show a session's environment one assistant turn (its message, then the results of its
        calls to the environment's tools); the answer has the messages to append, the step's
        reward and `done`. Only for a session seeded with `takes_turns`."""
        req = pb.StepRequest(session_id=session_id, messages=_messages(turn).messages)
        resp: pb.StepResponse = await self._unary(self.stub.Step, req)
        return resp

    async def verify(
        self, environment: str, task: Task, response: ResponseLike, *, session_id: str = ""
    ) -> pb.VerifyResult:
        req = verify_request(environment, task, response, session_id=session_id)
        resp: pb.VerifyResponse = await self._unary(self.stub.Verify, req)
        return resp.result

    async def verify_group(
        self,
        environment: str,
        task: Task,
        responses: Iterable[ResponseLike],
        *,
        session_ids: Iterable[str] = (),
    ) -> builtins.list[pb.VerifyResult]:
        """Score the rollouts of one task together (an environment whose `scores_groups`): one
        result per response, in order; `session_ids` (when given) pairs each with its session."""
        answers = [_messages(r) for r in responses]
        sessions = list(session_ids) or [""] * len(answers)
        if len(sessions) != len(answers):
            raise ValueError(f"{len(sessions)} session ids for {len(answers)} responses")
        req = pb.VerifyGroupRequest(
            environment=environment,
            task_json=_task_json(task),
            members=[
                pb.GroupMember(response=a, session_id=s) for a, s in zip(answers, sessions, strict=True)
            ],
        )
        resp: pb.VerifyGroupResponse = await self._unary(self.stub.VerifyGroup, req)
        return list(resp.results)

    async def close_session(self, session_id: str) -> None:
        await self._unary(self.stub.CloseSession, pb.CloseSessionRequest(session_id=session_id))

    def verify_many(
        self, requests: IdPairs[pb.VerifyRequest], *, window: int = 32, timeout_s: float = 300.0
    ) -> Answers[pb.VerifyResult]:
        """`GatewayClient.generate_many`'s contract over one `VerifyBatch` stream."""
        return call_many(verify_mux(self.stub), requests, window=window, deadline_s=timeout_s, close=True)

    async def verify_batch(
        self,
        requests: IdPairs[pb.VerifyRequest],
        *,
        timeout_s: float | None = None,
    ) -> AsyncIterator[pb.VerifyBatchResponse]:
        """The raw stream: (id, request) pairs in, responses (result or per-item error) back in
        completion order, with no window (`verify_many` bounds it and types the answers)."""

        async def gen() -> AsyncIterator[pb.VerifyBatchRequest]:
            async for item_id, req in id_pairs(requests):
                yield pb.VerifyBatchRequest(id=item_id, request=req)

        async for item in self._stream(self.stub.VerifyBatch, gen(), timeout_s=timeout_s):
            yield item
