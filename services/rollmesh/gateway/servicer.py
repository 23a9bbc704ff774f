"""The ModelGateway grpc.aio servicer: proto in, `Gateway` call, proto out."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

from rollmesh.gateway import convert
from rollmesh.gateway.core import DEFAULT_DRAIN_TIMEOUT_S
from rollmesh.gateway.core import Gateway
from rollmesh.gateway.core import InFlight
from rollmesh.gateway.errors import bad_request
from rollmesh.gateway.types import GenerateInput
from rollmesh.gateway.types import GenerateResult
from rollmesh.mesh import tracing
from rollmesh.mesh.fields import to_pb
from rollmesh.mesh.multiplex import Item
from rollmesh.mesh.multiplex import ItemMessages
from rollmesh.mesh.multiplex import MultiplexedMethod
from rollmesh.mesh.paging import page
from rollmesh_client.v1 import gateway_pb2 as pb
from rollmesh_client.v1 import gateway_pb2_grpc as pb_grpc

# Generations one GenerateMany stream may run at once; past it, reading the stream waits (flow control
# then slows the caller). High: a scheduler sends a whole job's turns over one stream, and its own
# concurrency bound is the one that should hold (20,000 rollouts in flight is a tested case).
MANY_CONCURRENCY = 65_536


async def _no_request() -> GenerateResult:
    raise bad_request("a GenerateMany item needs a request (or cancel: true)", "item")


def _timeout(context: Any) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else float(remaining)


def _update_options(request: pb.UpdateWeightsRequest) -> dict[str, Any]:
    """UpdateWeights' keyword options for `Gateway.update_weights` / `upload_weights`."""
    modes: dict[int, InFlight] = {
        pb.IN_FLIGHT_POLICY_ABORT_AND_RETRY: "abort_and_retry",
        pb.IN_FLIGHT_POLICY_CONTINUE: "continue",
    }
    mode = modes.get(request.in_flight, "finish")
    drain = request.drain_timeout_s if request.drain_timeout_s > 0 else DEFAULT_DRAIN_TIMEOUT_S
    return {"policy_version": request.policy_version, "in_flight": mode, "drain_timeout_s": drain}


class GatewayServicer(pb_grpc.ModelGatewayServicer):
    def __init__(self, gateway: Gateway) -> None:
        self._gw = gateway

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> pb.GenerateResponse:
        result = await self._gw.generate(convert.generate_from_pb(request), timeout_s=_timeout(context))
        return convert.result_to_pb(result)

    async def GenerateStream(
        self, request: pb.GenerateRequest, context: Any
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        stream = self._gw.generate_stream(convert.generate_from_pb(request), timeout_s=_timeout(context))
        async with contextlib.aclosing(stream):
            async for item in stream:
                yield convert.stream_item_to_pb(item)
                if isinstance(item, GenerateResult):
                    return

    async def GenerateMany(
        self, request_iterator: AsyncIterator[pb.GenerateManyRequest], context: Any
    ) -> AsyncIterator[pb.GenerateManyResponse]:
        async for message in self.generate_many().serve(request_iterator, context):
            yield message

    def generate_many(self) -> MultiplexedMethod[GenerateResult]:
        """GenerateMany's server side, which the embedded mesh also runs in-process (in_process.py)."""
        messages = ItemMessages("generate", pb.GenerateManyResponse, "response", convert.result_to_pb)
        return MultiplexedMethod(self._many_item, messages, MANY_CONCURRENCY)

    def _many_item(self, req: pb.GenerateManyRequest) -> Item[GenerateResult]:
        if req.WhichOneof("item") == "request":
            inp = convert.generate_from_pb(req.request)
            timeout = req.timeout_s if req.timeout_s > 0 else None
            work = functools.partial(self._gw.generate, inp, timeout_s=timeout)
            if not req.request.trace_context:  # (the common case: not in a sampled trace)
                return Item(req.id, work)
            traced = tracing.within(
                "gateway.generate", req.request.trace_context, work, _span_attributes(inp), _answer_attributes
            )
            return Item(req.id, traced)
        # An item with neither was dropped: its caller waited for an answer that never came.
        return Item(req.id) if req.cancel else Item(req.id, _no_request)

    async def ListModels(self, request: pb.ListModelsRequest, context: Any) -> pb.ListModelsResponse:
        models = await self._gw.list_models()
        items, token = page(models, request.page_size, request.page_token)
        return pb.ListModelsResponse(models=[to_pb(pb.ModelInfo, m) for m in items], next_page_token=token)

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        return pb.AbortResponse(aborted=await self._gw.abort(request.request_id))

    async def CloseSession(
        self, request: pb.CloseGatewaySessionRequest, context: Any
    ) -> pb.CloseGatewaySessionResponse:
        return pb.CloseGatewaySessionResponse(closed=self._gw.close_session(request.session_id))

    async def SetPolicyVersion(
        self, request: pb.SetPolicyVersionRequest, context: Any
    ) -> pb.SetPolicyVersionResponse:
        previous = self._gw.set_policy_version(request.model, request.version)
        return pb.SetPolicyVersionResponse(previous_version=previous)

    async def PauseGeneration(
        self, request: pb.PauseGenerationRequest, context: Any
    ) -> pb.PauseGenerationResponse:
        self._gw.pause(request.model)
        return pb.PauseGenerationResponse()

    async def ResumeGeneration(
        self, request: pb.ResumeGenerationRequest, context: Any
    ) -> pb.ResumeGenerationResponse:
        self._gw.resume(request.model)
        return pb.ResumeGenerationResponse()

    async def RegisterRoute(self, request: pb.RegisterRouteRequest, context: Any) -> pb.RegisterRouteResponse:
        status = await self._gw.register_route(
            request.route,
            target_model=request.target_model,
            base_url=request.base_url,
            api_key_env=request.api_key_env,
        )
        return pb.RegisterRouteResponse(model=to_pb(pb.ModelInfo, status))

    async def UpdateWeights(self, request: pb.UpdateWeightsRequest, context: Any) -> pb.UpdateWeightsResponse:
        update = await self._gw.update_weights(
            request.model, convert.checkpoint_path(request.checkpoint), **_update_options(request)
        )
        return to_pb(pb.UpdateWeightsResponse, update)

    async def UploadWeights(
        self, request_iterator: AsyncIterator[pb.UploadWeightsRequest], context: Any
    ) -> pb.UpdateWeightsResponse:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        head = convert.upload_head(first)
        update = await self._gw.upload_weights(
            head.model, convert.upload_pieces(requests), **_update_options(head)
        )
        return to_pb(pb.UpdateWeightsResponse, update)

    async def OpenCapture(self, request: pb.OpenCaptureRequest, context: Any) -> pb.OpenCaptureResponse:
        captures = self._gw.captures
        capture = captures.open(
            request.capture_id,
            model=request.model,
            sampling=convert.sampling_from_pb(request.sampling),
            session_id=request.session_id,
            max_calls=request.max_calls,
        )
        return pb.OpenCaptureResponse(
            base_url=captures.base_url(capture), path=capture.path, token=capture.token
        )

    async def CloseCapture(self, request: pb.CloseCaptureRequest, context: Any) -> pb.CloseCaptureResponse:
        capture = self._gw.captures.close(request.capture_id)
        return pb.CloseCaptureResponse(
            calls=[convert.captured_call_to_pb(c) for c in capture.calls], refused_calls=capture.refused
        )


def _span_attributes(inp: GenerateInput) -> dict[str, Any]:
    """gateway.generate's attributes at its start (semantic conventions: rpc.*, gen_ai.*)."""
    sampling = inp.sampling
    return {
        **tracing.rpc("rollmesh.v1.ModelGateway", "Generate"),
        **tracing.gen_ai_request(
            inp.model, temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens
        ),
        "rollmesh.session_bound": bool(inp.session_id),
        "rollmesh.messages": len(inp.messages),
    }


def _answer_attributes(result: GenerateResult) -> dict[str, Any]:
    """gateway.generate's attributes at its end: usage, finish reason, replica, policy version."""
    return {
        **tracing.gen_ai_response(
            input_tokens=result.usage.prompt_tokens,
            output_tokens=result.usage.completion_tokens,
            finish_reason=result.finish_reason,
            model=result.model,
        ),
        "rollmesh.replica_id": result.replica_id,
        "rollmesh.policy_version": result.policy_version,
        "rpc.grpc.status_code": 0,
    }
