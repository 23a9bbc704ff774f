"""Typed client for the ModelGateway."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import Literal

from rollmesh_client._base import ServiceClient
from rollmesh_client._errors import RollmeshClientError
from rollmesh_client._errors import from_status
from rollmesh_client._streams import Answers
from rollmesh_client._streams import IdPairs
from rollmesh_client._streams import Multiplexed
from rollmesh_client._streams import call_many
from rollmesh_client._weights_upload import CHUNK_BYTES
from rollmesh_client._weights_upload import FileSource
from rollmesh_client._weights_upload import folder_files
from rollmesh_client._weights_upload import state_dict_bytes
from rollmesh_client._weights_upload import upload_requests
from rollmesh_client.v1 import common_pb2 as cpb
from rollmesh_client.v1 import gateway_pb2 as pb
from rollmesh_client.v1 import gateway_pb2_grpc as pb_grpc

MessageLike = cpb.ChatMessage | Mapping[str, Any]
#: What a weight update does to running generations (UpdateWeightsRequest.in_flight).
InFlight = Literal["finish", "abort_and_retry", "continue"]
ToolLike = cpb.ToolSpec | Mapping[str, Any]


def _update_head(
    *, model: str, checkpoint: str, policy_version: str, in_flight: str, drain_timeout_s: float
) -> pb.UpdateWeightsRequest:
    modes = {"abort_and_retry": pb.IN_FLIGHT_POLICY_ABORT_AND_RETRY, "continue": pb.IN_FLIGHT_POLICY_CONTINUE}
    mode = modes.get(in_flight, pb.IN_FLIGHT_POLICY_FINISH)
    return pb.UpdateWeightsRequest(
        model=model,
        checkpoint=checkpoint,
        policy_version=policy_version,
        in_flight=mode,
        drain_timeout_s=drain_timeout_s,
    )


def chat_message(m: MessageLike) -> cpb.ChatMessage:
    """A ChatMessage from a proto or an OpenAI-style dict (`tool_calls[].function.arguments` as text
    or an object)."""
    if isinstance(m, cpb.ChatMessage):
        return m
    calls = []
    for c in m.get("tool_calls") or ():
        fn = c.get("function", c)
        args = fn.get("arguments", fn.get("arguments_json", "{}"))
        calls.append(
            cpb.ToolCall(
                id=str(c.get("id", "")),
                name=str(fn.get("name", "")),
                arguments_json=args if isinstance(args, str) else json.dumps(args),
            )
        )
    return cpb.ChatMessage(
        role=str(m.get("role", "")),
        content=str(m.get("content") or ""),
        tool_calls=calls,
        tool_call_id=str(m.get("tool_call_id") or ""),
        name=str(m.get("name") or ""),
    )


def tool_spec(t: ToolLike) -> cpb.ToolSpec:
    """A ToolSpec from a proto or an OpenAI-style tool dict."""
    if isinstance(t, cpb.ToolSpec):
        return t
    fn = t.get("function", t)
    params = fn.get("parameters")
    return cpb.ToolSpec(
        name=str(fn.get("name", "")),
        description=str(fn.get("description") or ""),
        parameters_json=params
        if isinstance(params, str)
        else (json.dumps(params) if params is not None else ""),
    )


def sampling_params(
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    seed: int | None = None,
    logprobs: bool | None = None,
    ignore_eos: bool | None = None,
) -> cpb.SamplingParams:
    """Sampling for a request; an option left at None stays unset (the model's default applies)."""
    given: dict[str, Any] = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "max_tokens": max_tokens,
        "seed": seed,
        "logprobs": logprobs,
        "ignore_eos": ignore_eos,
    }
    return cpb.SamplingParams(stop=list(stop), **{k: v for k, v in given.items() if v is not None})


GenerateMux = Multiplexed[pb.GenerateManyRequest, pb.GenerateManyResponse, pb.GenerateResponse]


def _generate_answer(resp: pb.GenerateManyResponse) -> tuple[str, pb.GenerateResponse | RollmeshClientError]:
    return resp.id, (from_status(resp.error) if resp.HasField("error") else resp.response)


def generate_mux(stub: pb_grpc.ModelGatewayStub) -> GenerateMux:
    """`Generate` calls multiplexed over one `GenerateMany` stream: `await mux.call(request, deadline_s)`.
    A cancelled or timed-out call sends a cancel item (the gateway aborts the engine request)."""
    return Multiplexed(
        stub.GenerateMany,
        make_item=lambda i, req, deadline_s: pb.GenerateManyRequest(
            id=i, request=req, timeout_s=deadline_s or 0
        ),
        make_cancel=lambda i: pb.GenerateManyRequest(id=i, cancel=True),
        read_answer=_generate_answer,
        what="Generate",
    )


class GatewayClient(ServiceClient):
    """`Generate`, `GenerateStream`, `ListModels` (paged for you) and the admin RPCs."""

    stub_class = pb_grpc.ModelGatewayStub

    @staticmethod
    def request(
        messages: Sequence[MessageLike] = (),
        *,
        model: str = "",
        prompt_token_ids: Sequence[int] = (),
        tools: Sequence[ToolLike] = (),
        sampling: cpb.SamplingParams | None = None,
        session_id: str = "",
        request_id: str = "",
        **sampling_kwargs: Any,
    ) -> pb.GenerateRequest:
        """`sampling=` a SamplingParams, or its fields as keywords (temperature=, max_tokens=, ...)."""
        if sampling_kwargs:
            if sampling is not None:
                raise TypeError("give sampling= or sampling keywords, not both")
            sampling = sampling_params(**sampling_kwargs)
        return pb.GenerateRequest(
            model=model,
            messages=[chat_message(m) for m in messages],
            prompt_token_ids=list(prompt_token_ids),
            tools=[tool_spec(t) for t in tools],
            sampling=sampling,
            session_id=session_id,
            request_id=request_id,
        )

    async def generate(
        self,
        messages: Sequence[MessageLike] = (),
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> pb.GenerateResponse:
        """One generation; keyword arguments as in `request(...)`."""
        resp: pb.GenerateResponse = await self._unary(
            self.stub.Generate, self.request(messages, **kwargs), timeout_s=timeout_s
        )
        return resp

    async def generate_stream(
        self,
        messages: Sequence[MessageLike] = (),
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        """Deltas as they are produced; the last message has `final` set."""
        async for item in self._stream(
            self.stub.GenerateStream, self.request(messages, **kwargs), timeout_s=timeout_s or self.timeout_s
        ):
            yield item

    def generate_many(
        self, requests: IdPairs[pb.GenerateRequest], *, window: int = 64, timeout_s: float = 300.0
    ) -> Answers[pb.GenerateResponse]:
        """`call_many` over one `GenerateMany` stream: at most `window` unanswered, (id, response or
        that item's error) in completion order; an item unanswered for `timeout_s` or a broken
        stream ends the iteration with that error."""
        return call_many(generate_mux(self.stub), requests, window=window, deadline_s=timeout_s, close=True)

    async def models(self, *, page_size: int = 100) -> AsyncIterator[pb.ModelInfo]:
        async for m in self._pages(
            self.stub.ListModels, lambda t: pb.ListModelsRequest(page_size=page_size, page_token=t), "models"
        ):
            yield m

    async def abort(self, request_id: str) -> bool:
        resp: pb.AbortResponse = await self._unary(self.stub.Abort, pb.AbortRequest(request_id=request_id))
        return resp.aborted

    async def close_session(self, session_id: str) -> bool:
        resp: pb.CloseGatewaySessionResponse = await self._unary(
            self.stub.CloseSession, pb.CloseGatewaySessionRequest(session_id=session_id)
        )
        return resp.closed

    async def set_policy_version(self, version: str, *, model: str = "") -> str:
        """Label later responses with `version`; returns the previous label."""
        resp: pb.SetPolicyVersionResponse = await self._unary(
            self.stub.SetPolicyVersion, pb.SetPolicyVersionRequest(model=model, version=version)
        )
        return resp.previous_version

    async def pause(self, *, model: str = "") -> None:
        await self._unary(self.stub.PauseGeneration, pb.PauseGenerationRequest(model=model))

    async def resume(self, *, model: str = "") -> None:
        await self._unary(self.stub.ResumeGeneration, pb.ResumeGenerationRequest(model=model))

    async def register_route(
        self, route: str, *, target_model: str = "", base_url: str = "", api_key_env: str = ""
    ) -> pb.ModelInfo:
        resp: pb.RegisterRouteResponse = await self._unary(
            self.stub.RegisterRoute,
            pb.RegisterRouteRequest(
                route=route, target_model=target_model, base_url=base_url, api_key_env=api_key_env
            ),
        )
        return resp.model

    async def update_weights(
        self,
        checkpoint: str | os.PathLike[str],
        *,
        model: str = "",
        policy_version: str = "",
        in_flight: InFlight = "finish",
        drain_timeout_s: float = 0.0,
        timeout_s: float | None = 600.0,
    ) -> pb.UpdateWeightsResponse:
        """Load `checkpoint` (a safetensors folder the gateway and its replicas can read, or a registry
        model name) into every replica of `model` and bump its policy version (`policy_version`, or
        the previous integer + 1), all replicas or none. `in_flight`: running generations "finish" on
        the old weights, or are aborted and run again on the new ones ("abort_and_retry"), or stop and
        go on on the new weights from the ids they produced ("continue": partial rollouts; each
        response's `versions` says which version produced which ids).
        Raises CHECKPOINT_INCOMPATIBLE (nothing touched), WEIGHT_LOAD_FAILED (rolled back),
        WEIGHT_UPDATE_DRAIN_TIMEOUT (nothing changed)."""
        resp: pb.UpdateWeightsResponse = await self._unary(
            self.stub.UpdateWeights,
            _update_head(
                model=model,
                checkpoint=os.fspath(checkpoint),
                policy_version=policy_version,
                in_flight=in_flight,
                drain_timeout_s=drain_timeout_s,
            ),
            timeout_s=timeout_s,
        )
        return resp

    async def upload_weights(
        self,
        files: Mapping[str, FileSource],
        *,
        model: str = "",
        policy_version: str = "",
        in_flight: InFlight = "finish",
        drain_timeout_s: float = 0.0,
        chunk_bytes: int = CHUNK_BYTES,
        timeout_s: float | None = 600.0,
    ) -> pb.UpdateWeightsResponse:
        """`update_weights` with the checkpoint's files streamed in the call (UploadWeights), for a
        trainer that shares no filesystem with the gateway: `files` maps each file name
        (model.safetensors, config.json, ...) to its bytes or a local path. Each file goes in pieces
        with its sha256; the gateway stages them (at most the served checkpoint's size plus a margin:
        UPLOAD_TOO_LARGE past it; UPLOAD_INVALID for a bad digest or name), then updates as
        `update_weights` does (same errors)."""
        if not files:  # here, not in the request stream: raised there it became a CancelledError
            raise ValueError("an upload needs at least one file")
        head = _update_head(
            model=model,
            checkpoint="",
            policy_version=policy_version,
            in_flight=in_flight,
            drain_timeout_s=drain_timeout_s,
        )
        resp: pb.UpdateWeightsResponse = await self._unary(
            self.stub.UploadWeights,
            upload_requests(head, files, chunk_bytes=chunk_bytes),
            timeout_s=timeout_s,
        )
        return resp

    async def update_weights_from_folder(
        self, folder: str | os.PathLike[str], **options: Any
    ) -> pb.UpdateWeightsResponse:
        """`upload_weights` of every file in a local checkpoint folder (e.g. `save_pretrained`'s)."""
        return await self.upload_weights(folder_files(folder), **options)

    async def update_weights_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        *,
        extra_files: Mapping[str, FileSource] | None = None,
        **options: Any,
    ) -> pb.UpdateWeightsResponse:
        """`upload_weights` of a torch state dict as model.safetensors (plus `extra_files`), named as
        the served checkpoint names its tensors (leave out a tied lm_head.weight it leaves out)."""
        data = await asyncio.to_thread(state_dict_bytes, state_dict)
        return await self.upload_weights({"model.safetensors": data, **(extra_files or {})}, **options)
