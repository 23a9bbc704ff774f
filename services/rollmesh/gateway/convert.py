"""Proto <-> domain conversions for the gateway (the only module here besides the servicer that
sees *_pb2)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.gateway.captures import CapturedCall
from rollmesh.gateway.types import GenerateInput
from rollmesh.gateway.types import GenerateResult
from rollmesh.gateway.types import StreamDelta
from rollmesh.gateway.uploads import UploadPiece
from rollmesh.mesh.chat import message_from_pb
from rollmesh.mesh.chat import message_to_pb
from rollmesh.mesh.chat import tool_spec_from_pb
from rollmesh.mesh.chat import tool_spec_to_pb
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.errors import InvalidArgument
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.fields import from_pb
from rollmesh.mesh.fields import to_pb
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2 as pb


def sampling_from_pb(s: common_pb2.SamplingParams) -> SamplingInput:
    return from_pb(SamplingInput, s)


def generate_from_pb(r: pb.GenerateRequest) -> GenerateInput:
    return from_pb(
        GenerateInput,
        r,
        messages=tuple(message_from_pb(m) for m in r.messages),
        tools=tuple(tool_spec_from_pb(t) for t in r.tools),
        sampling=sampling_from_pb(r.sampling),
    )


def captured_call_to_pb(c: CapturedCall) -> pb.CapturedCall:
    return pb.CapturedCall(
        api=c.api,
        messages=[message_to_pb(m) for m in c.input.messages],
        tools=[tool_spec_to_pb(t) for t in c.input.tools],
        response=result_to_pb(c.result),
        requested_model=c.requested_model,
    )


def result_to_pb(r: GenerateResult) -> pb.GenerateResponse:
    return to_pb(pb.GenerateResponse, r, message=message_to_pb(r.message))


def stream_item_to_pb(item: StreamDelta | GenerateResult) -> pb.GenerateStreamResponse:
    if isinstance(item, GenerateResult):
        return pb.GenerateStreamResponse(final=result_to_pb(item))
    return pb.GenerateStreamResponse(text_delta=item.text, token_ids=item.token_ids, logprobs=item.logprobs)


def checkpoint_path(checkpoint: str) -> Path:
    """UpdateWeights' `checkpoint`: a folder, else a registry model name, resolved to a folder."""
    from rollmesh.gateway.backends.factory import resolve_model_path

    if not checkpoint:
        raise InvalidArgument(
            "checkpoint is empty: give a folder or a registry model name", metadata={"field": "checkpoint"}
        )
    try:
        return resolve_model_path(checkpoint)
    except (ConfigError, RollmeshError) as exc:
        raise InvalidArgument(
            f"checkpoint {checkpoint!r} is neither a folder nor a registry model: {exc}",
            metadata={"field": "checkpoint"},
        ) from None


def upload_head(first: pb.UploadWeightsRequest | None) -> pb.UpdateWeightsRequest:
    """UploadWeights' first message: `update` only, with no checkpoint (the files are the checkpoint)."""
    if first is None or not first.HasField("update") or first.file_name or first.data:
        raise InvalidArgument(
            "UploadWeights' first message carries `update` (model, policy_version, in_flight) and no file",
            metadata={"field": "update"},
        )
    if first.update.checkpoint:
        raise InvalidArgument(
            "UploadWeights takes no update.checkpoint: the streamed files are the checkpoint",
            metadata={"field": "update.checkpoint"},
        )
    return first.update


async def upload_pieces(requests: AsyncIterator[pb.UploadWeightsRequest]) -> AsyncIterator[UploadPiece]:
    """The file pieces of an UploadWeights stream, after its first message."""
    async for r in requests:
        if r.HasField("update"):
            raise InvalidArgument(
                "only UploadWeights' first message carries `update`", metadata={"field": "update"}
            )
        yield UploadPiece(file_name=r.file_name, data=r.data, sha256=r.sha256)
