"""Proto <-> domain conversions for the gateway (the only module here besides the servicer that
sees *_pb2)."""

from __future__ import annotations

from pathlib import Path

from rollmesh.gateway.types import (
    GenerateInput,
    GenerateResult,
    ModelStatus,
    SamplingInput,
    StreamDelta,
    WeightUpdate,
)
from rollmesh.mesh.chat import message_from_pb, message_to_pb, tool_spec_from_pb
from rollmesh.mesh.config import ConfigError
from rollmesh.mesh.errors import InvalidArgument, RollmeshError
from rollmesh_client.v1 import common_pb2 as cpb
from rollmesh_client.v1 import gateway_pb2 as pb


def sampling_from_pb(s: cpb.SamplingParams) -> SamplingInput:
    return SamplingInput(
        temperature=s.temperature if s.HasField("temperature") else None,
        top_p=s.top_p if s.HasField("top_p") else None,
        top_k=s.top_k if s.HasField("top_k") else None,
        max_tokens=s.max_tokens if s.HasField("max_tokens") else None,
        stop=tuple(s.stop),
        seed=s.seed if s.HasField("seed") else None,
        logprobs=s.logprobs if s.HasField("logprobs") else False,
        ignore_eos=s.ignore_eos if s.HasField("ignore_eos") else False,
    )


def generate_from_pb(r: pb.GenerateRequest) -> GenerateInput:
    return GenerateInput(
        model=r.model,
        messages=tuple(message_from_pb(m) for m in r.messages),
        prompt_token_ids=tuple(r.prompt_token_ids),
        tools=tuple(tool_spec_from_pb(t) for t in r.tools),
        sampling=sampling_from_pb(r.sampling),
        session_id=r.session_id,
        request_id=r.request_id,
    )


def result_to_pb(r: GenerateResult) -> pb.GenerateResponse:
    return pb.GenerateResponse(
        message=message_to_pb(r.message),
        prompt_token_ids=r.prompt_token_ids,
        output_token_ids=r.output_token_ids,
        logprobs=r.logprobs,
        finish_reason=r.finish_reason,
        usage=cpb.Usage(
            prompt_tokens=r.usage.prompt_tokens,
            completion_tokens=r.usage.completion_tokens,
            total_tokens=r.usage.total_tokens,
        ),
        replica_id=r.replica_id,
        policy_version=r.policy_version,
        model=r.model,
        request_id=r.request_id,
        reused_prefix_tokens=r.reused_prefix_tokens,
    )


def stream_item_to_pb(item: StreamDelta | GenerateResult) -> pb.GenerateStreamResponse:
    if isinstance(item, GenerateResult):
        return pb.GenerateStreamResponse(final=result_to_pb(item))
    return pb.GenerateStreamResponse(text_delta=item.text, token_ids=item.token_ids, logprobs=item.logprobs)


def model_to_pb(m: ModelStatus) -> pb.ModelInfo:
    return pb.ModelInfo(
        name=m.name,
        backend=m.backend,
        replicas=[
            pb.ReplicaInfo(
                replica_id=r.replica_id, healthy=r.healthy, in_flight=r.in_flight, sessions=r.sessions
            )
            for r in m.replicas
        ],
        max_model_len=m.max_model_len,
        policy_version=m.policy_version,
        paused=m.paused,
        is_default=m.is_default,
    )


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


def weight_update_to_pb(u: WeightUpdate) -> pb.UpdateWeightsResponse:
    return pb.UpdateWeightsResponse(
        policy_version=u.policy_version,
        previous_version=u.previous_version,
        replica_ids=list(u.replica_ids),
        retried_requests=u.retried_requests,
        paused_s=u.paused_s,
        checkpoint_path=u.checkpoint_path,
        tensors=u.tensors,
    )
