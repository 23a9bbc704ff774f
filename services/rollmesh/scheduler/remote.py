"""The agent loop's ports over gRPC: the ModelGateway and the EnvironmentVerifier.

One channel per target (`rollmesh_client.aio_channel`), and errors as the SDK's typed classes
(`unary_call`, here `_call`), which carry the code the retry policy classifies. Deadlines have one
owner, the job: model, tool and verify calls have none of their own; the job's retry policy bounds
them (each attempt's `rollout_timeout_s`, each model call's adaptive deadline: engine.py,
deadline.py), and cancelling the caller cancels the call on the server (a stream call sends a
cancel item). Only the calls around a rollout (sessions, listings) are capped here, at
`SERVICE_CALL_S`.
Generate and Verify calls go over one long-lived stream each, the SDK's multiplexed clients
(`generate_mux`, `verify_mux`: rollmesh_client/_streams.py): a stream message costs both ends a
fraction of a unary RPC. A gateway without GenerateMany (UNIMPLEMENTED) is called with unary
`Generate` instead.

Inside a sampled trace (mesh/tracing.py), each call carries the current span's W3C context: a unary
call in its metadata (`_call`), a Generate or Verify item in its `trace_context`; other calls carry
nothing (no channel interceptor: it would cost every call a task).
Every call to the gateway and the verifier is counted by method and status code and timed as the
scheduler sees it (scheduler/telemetry.py `CallRecorder`, one per method, made at import).
`connect(address)` makes a port over gRPC; `in_process(servicer)` one on the service's servicer in
this process (the embedded mesh, launch/embedded.py), with the same messages, errors, deadlines and
cancellation but no gRPC hop (mesh/in_process.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import Protocol
from typing import Self
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from rollmesh.mesh import tracing
from rollmesh.mesh.in_process import InProcessMux
from rollmesh.mesh.in_process import InProcessStub
from rollmesh.mesh.multiplex import MultiplexedMethod
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.mesh.versions import spans_from
from rollmesh.scheduler.convert import message_from_pb
from rollmesh.scheduler.convert import message_to_pb
from rollmesh.scheduler.convert import sampling_to_pb
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.drivers.agent_loop import EnvStep
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.drivers.agent_loop import GroupMember
from rollmesh.scheduler.drivers.agent_loop import Json
from rollmesh.scheduler.drivers.agent_loop import SessionOpened
from rollmesh.scheduler.drivers.agent_loop import ToolResult
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.drivers.program import CapturedTurn
from rollmesh.scheduler.drivers.program import CaptureOpened
from rollmesh.scheduler.drivers.program import CaptureRecord
from rollmesh.scheduler.errors import BadReward
from rollmesh.scheduler.json_encode import encoder
from rollmesh.scheduler.telemetry import CallRecorder
from rollmesh_client import AlreadyExistsError
from rollmesh_client import Multiplexed
from rollmesh_client import NotFoundError
from rollmesh_client import RollmeshClientError
from rollmesh_client import aio_channel
from rollmesh_client import generate_mux
from rollmesh_client import unary_call
from rollmesh_client import verify_mux
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import gateway_pb2_grpc
from rollmesh_client.v1 import verifier_pb2
from rollmesh_client.v1 import verifier_pb2_grpc

R = TypeVar("R")

# The deadline of a call around a rollout (open or close a session, list models, describe an
# environment): the service answers these at once, whatever the job's own deadlines are.
SERVICE_CALL_S = 30.0


# A task as the verifier reads it (json.dumps(task, ensure_ascii=False)'s text), by one encoder made
# once (json_encode.py: json.dumps builds one per call, 1.7 -> 0.9 us for a row of the arithmetic
# dataset, on every SeedSession and Verify). No circular-reference check: a task is a parsed JSON row.
_task_json = encoder(ensure_ascii=False)


async def _call(
    recorder: CallRecorder, method: Callable[..., Awaitable[R]], request: Any, timeout_s: float | None
) -> R:
    """`unary_call`, with the current span's W3C context in the metadata inside a sampled trace, in
    the scheduler's call metrics (`recorder`: the service and method)."""
    start = time.perf_counter()
    try:
        answer = await unary_call(method, request, timeout_s, metadata=tracing.metadata())
    except BaseException as exc:
        recorder.failed(exc, start)
        raise
    recorder.answered(start)
    return answer


def _recorders(service: str, *methods: str) -> dict[str, CallRecorder]:
    return {method: CallRecorder(service, method) for method in methods}


def tool_to_pb(tool: Json) -> common_pb2.ToolSpec:
    params = tool.get("parameters", {})
    return common_pb2.ToolSpec(
        name=str(tool["name"]),
        description=str(tool.get("description", "")),
        parameters_json=params if isinstance(params, str) else json.dumps(params),
    )


def tool_from_pb(spec: common_pb2.ToolSpec) -> Json:
    return {
        "name": spec.name,
        "description": spec.description,
        "parameters": json.loads(spec.parameters_json) if spec.parameters_json else {},
    }


class _Caller(Protocol):
    """A multiplexed method's calls: the SDK's `Multiplexed`, or `InProcessMux`."""

    async def call(self, payload: Any, deadline_s: None) -> Any: ...

    async def close(self) -> None: ...


class _Port:
    """A service's stub and multiplexed method, over gRPC (`connect`) or in process (`in_process`)."""

    def __init__(self, stub: Any, many: _Caller, *, channel: grpc.aio.Channel | None = None) -> None:
        self.stub = stub
        self._many = many
        self.channel = channel

    async def _unary(self, method: str, request: Any, timeout_s: float | None) -> Any:
        """The unary call `method` of the stub (`_call`), in that method's call metrics."""
        return await _call(self._calls[method], getattr(self.stub, method), request, timeout_s)

    # Set by each port: its methods' call metrics (scheduler/telemetry.py), its gRPC stub class, the
    # SDK's multiplexed client of its stream method, and the servicer's method that describes that
    # stream's server side (mesh/in_process.py).
    _calls: dict[str, CallRecorder]
    _stub_class: Any = None
    _mux: Callable[[Any], Multiplexed[Any, Any, Any]]
    _stream_method = ""

    @classmethod
    def connect(cls, address: str, *, api_key: str | None = None) -> Self:
        channel = aio_channel(address, api_key=api_key)
        stub = cls._stub_class(channel)
        return cls(stub, cls._mux(stub), channel=channel)

    @classmethod
    def in_process(cls, servicer: Any) -> Self:
        stub = InProcessStub(servicer)
        method: MultiplexedMethod[Any] = getattr(servicer, cls._stream_method)()
        return cls(stub, InProcessMux(cls._mux(stub), method))

    async def close(self) -> None:
        await self._many.close()
        if self.channel is not None:
            await self.channel.close()

    async def responsive(self, timeout_s: float) -> bool:
        """Does the service answer a health check within `timeout_s`? (Any answer counts: a process
        that answers is alive; one stopped or wedged answers nothing.) A service in this process
        (`in_process`) is as alive as the caller: a slow call there is never taken for a hang."""
        if self.channel is None:
            return True
        try:
            await health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        return True


class GatewayModel(_Port):
    """ModelPort over the ModelGateway."""

    _calls = _recorders("gateway", "Generate", "CloseSession", "ListModels", "OpenCapture", "CloseCapture")
    _stub_class = gateway_pb2_grpc.ModelGatewayStub
    _mux = staticmethod(generate_mux)
    _stream_method = "generate_many"
    _unary_only = False  # the gateway has no GenerateMany

    async def generate(self, call: GenerateCall) -> Turn:
        return turn_of(await self._generate(generate_request(call)))

    async def _generate(self, req: gateway_pb2.GenerateRequest) -> gateway_pb2.GenerateResponse:
        recorder = self._calls["Generate"]
        if not self._unary_only:
            start = time.perf_counter()
            try:
                answer: gateway_pb2.GenerateResponse = await self._many.call(req, None)
            except RollmeshClientError as exc:
                if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                    recorder.failed(exc, start)
                    raise
                self._unary_only = True
            except BaseException as exc:
                recorder.failed(exc, start)
                raise
            else:
                recorder.answered(start)
                return answer
        resp: gateway_pb2.GenerateResponse = await self._unary("Generate", req, None)
        return resp

    async def close_session(self, session_id: str) -> None:
        req = gateway_pb2.CloseGatewaySessionRequest(session_id=session_id)
        await self._unary("CloseSession", req, SERVICE_CALL_S)

    async def engine_capacity(self, model: str) -> int:
        req = gateway_pb2.ListModelsRequest(page_size=1000)
        resp: gateway_pb2.ListModelsResponse = await self._unary("ListModels", req, SERVICE_CALL_S)
        for m in resp.models:
            if m.name == model or (not model and m.is_default):
                return sum(r.max_batch for r in m.replicas if r.healthy)
        return 0

    async def open_capture(
        self, capture_id: str, *, model: str, sampling: Json, session_id: str
    ) -> CaptureOpened:
        req = gateway_pb2.OpenCaptureRequest(
            capture_id=capture_id, model=model, sampling=sampling_to_pb(sampling), session_id=session_id
        )
        resp: gateway_pb2.OpenCaptureResponse = await self._unary("OpenCapture", req, SERVICE_CALL_S)
        return CaptureOpened(base_url=resp.base_url, token=resp.token)

    async def close_capture(self, capture_id: str) -> CaptureRecord:
        req = gateway_pb2.CloseCaptureRequest(capture_id=capture_id)
        resp: gateway_pb2.CloseCaptureResponse = await self._unary("CloseCapture", req, SERVICE_CALL_S)
        calls = [
            CapturedTurn(
                api=c.api,
                messages=[message_from_pb(m) for m in c.messages],
                turn=turn_of(c.response),
                requested_model=c.requested_model,
                model=c.response.model,
            )
            for c in resp.calls
        ]
        return CaptureRecord(calls=calls, refused=resp.refused_calls)


def generate_request(call: GenerateCall) -> gateway_pb2.GenerateRequest:
    """The call as a request: `to_pb`'s (every same-named field copied), its fields named (every model
    turn: 5.7 -> 3.3 us); test_remote_messages checks the two agree."""
    return gateway_pb2.GenerateRequest(
        model=call.model,
        messages=[message_to_pb(m) for m in call.messages],
        tools=[tool_to_pb(t) for t in call.tools],
        sampling=sampling_to_pb(call.sampling),
        session_id=call.session_id,
        request_id=call.request_id,
        # The model turn's span (mesh/tracing.py); None, not {}, leaves the map unset: a message
        # built with a map, even an empty one, fills it through a Python-level update (~5 us).
        trace_context=tracing.inject() or None,
    )


def turn_of(resp: gateway_pb2.GenerateResponse) -> Turn:
    """The Turn of a response: `from_pb`'s (every same-named field copied), its fields named (every
    model turn: 4.2 -> 2.4 us); test_remote_messages checks the two agree."""
    return Turn(
        message=message_from_pb(resp.message),
        prompt_token_ids=resp.prompt_token_ids[:],  # a list; list() of one iterates to an IndexError
        output_token_ids=resp.output_token_ids[:],
        logprobs=resp.logprobs[:],
        finish_reason=resp.finish_reason,
        prompt_tokens=resp.usage.prompt_tokens,
        completion_tokens=resp.usage.completion_tokens,
        replica_id=resp.replica_id,
        policy_version=resp.policy_version,
        first_token_s=resp.first_token_s,
        versions=spans_from(resp.versions) if resp.versions else (),
    )


def verdict_of(r: verifier_pb2.VerifyResult) -> VerifyResult:
    """The VerifyResult of a message: `from_pb`'s (every same-named field copied, details parsed), its
    fields named (every verify: 3.3 -> 2.3 us); test_remote_messages checks the two agree."""
    return VerifyResult(
        reward=r.reward,
        components=dict(r.components),
        extracted_answer=r.extracted_answer,
        details=json.loads(r.details_json) if r.details_json else {},
        masked=r.masked,
    )


class VerifierEnv(_Port):
    """EnvPort over the EnvironmentVerifier."""

    _calls = _recorders(
        "verifier",
        "Verify",
        "VerifyGroup",
        "SeedSession",
        "CallTool",
        "Step",
        "CloseSession",
        "GetEnvironment",
    )
    _stub_class = verifier_pb2_grpc.EnvironmentVerifierStub
    _mux = staticmethod(verify_mux)
    _stream_method = "verify_batch"

    async def seed_session(self, environment: str, task: Json, session_id: str) -> SessionOpened:
        req = verifier_pb2.SeedSessionRequest(
            environment=environment, task_json=_task_json(task), session_id=session_id
        )
        try:
            resp: verifier_pb2.SeedSessionResponse = await self._unary("SeedSession", req, SERVICE_CALL_S)
        except AlreadyExistsError:
            # Left over from an attempt whose close was lost (or a crashed run): start it afresh.
            with contextlib.suppress(NotFoundError):
                await self.close_session(session_id)
            resp = await self._unary("SeedSession", req, SERVICE_CALL_S)
        return SessionOpened(
            tools=[tool_from_pb(t) for t in resp.tools],
            messages=[message_from_pb(m) for m in resp.messages],
            takes_turns=resp.takes_turns,
            session_tools=[tool_from_pb(t) for t in resp.session_tools],
        )

    async def call_tool(self, session_id: str, call: Json) -> ToolResult:
        fn = call.get("function") if isinstance(call.get("function"), dict) else call
        assert isinstance(fn, dict)
        args = fn.get("arguments", "")
        req = verifier_pb2.CallToolRequest(
            session_id=session_id,
            call=common_pb2.ToolCall(
                id=str(call.get("id", "")),
                name=str(fn.get("name", "")),
                arguments_json=args if isinstance(args, str) else json.dumps(args),
            ),
        )
        resp: verifier_pb2.CallToolResponse = await self._unary("CallTool", req, None)
        return ToolResult(output=resp.output, is_error=resp.is_error, ends_agent=resp.ends_agent)

    async def step(self, session_id: str, messages: list[Json]) -> EnvStep:
        req = verifier_pb2.StepRequest(session_id=session_id, messages=[message_to_pb(m) for m in messages])
        resp: verifier_pb2.StepResponse = await self._unary("Step", req, None)
        if not math.isfinite(resp.reward):
            raise BadReward(f"the verifier answered step reward = {resp.reward}, not a finite number")
        return EnvStep(
            messages=[message_from_pb(m) for m in resp.messages],
            reward=resp.reward,
            done=resp.done,
            info=json.loads(resp.info_json) if resp.info_json else {},
        )

    async def verify(
        self, environment: str, task: Json, messages: list[Json], session_id: str
    ) -> VerifyResult:
        req = verifier_pb2.VerifyRequest(
            environment=environment,
            task_json=_task_json(task),
            response=verifier_pb2.ModelResponse(messages=[message_to_pb(m) for m in messages]),
            session_id=session_id,
            trace_context=tracing.inject() or None,  # the verify span's (as in generate)
        )
        recorder, start = self._calls["Verify"], time.perf_counter()
        try:
            r = await self._many.call(req, None)
        except BaseException as exc:
            recorder.failed(exc, start)
            raise
        recorder.answered(start)
        result = verdict_of(r)
        if bad := result.not_finite():
            raise BadReward(f"the verifier answered {bad}, not a finite number")
        return result

    async def verify_group(
        self, environment: str, task: Json, members: list[GroupMember]
    ) -> list[VerifyResult]:
        req = verifier_pb2.VerifyGroupRequest(
            environment=environment,
            task_json=_task_json(task),
            members=[
                verifier_pb2.GroupMember(
                    response=verifier_pb2.ModelResponse(messages=[message_to_pb(m) for m in member.messages]),
                    session_id=member.session_id,
                )
                for member in members
            ],
        )
        resp: verifier_pb2.VerifyGroupResponse = await self._unary("VerifyGroup", req, None)
        if len(resp.results) != len(members):
            raise BadReward(
                f"the verifier answered {len(resp.results)} results for a group of {len(members)} rollouts"
            )
        results = [verdict_of(r) for r in resp.results]
        if bad := next((b for r in results if (b := r.not_finite())), ""):
            raise BadReward(f"the verifier answered {bad}, not a finite number")
        return results

    async def close_session(self, session_id: str) -> None:
        req = verifier_pb2.CloseSessionRequest(session_id=session_id)
        await self._unary("CloseSession", req, SERVICE_CALL_S)

    async def describe_environment(self, environment: str) -> EnvDescription:
        req = verifier_pb2.GetEnvironmentRequest(name=environment)
        resp: verifier_pb2.Environment = await self._unary("GetEnvironment", req, SERVICE_CALL_S)
        return EnvDescription(
            tools=[tool_from_pb(t) for t in resp.tools],
            stateless=resp.stateless,
            tool_calls_are_answer=resp.tool_calls_are_answer,
            scores_groups=resp.scores_groups,
            public_fields=tuple(resp.public_fields),
            example_dataset=resp.example_dataset,
            description=resp.description,
        )
