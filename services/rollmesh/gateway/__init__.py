"""The model gateway: the only door to models (gRPC ModelGateway + an OpenAI-compatible HTTP facade)."""

from rollmesh.gateway.backends.base import (
    EngineChunk,
    EngineRequest,
    ModelBackend,
    ModelCard,
    ReplicaStatus,
    Sampling,
    Tokenizer,
)
from rollmesh.gateway.config import GatewayConfig, ModelSpec
from rollmesh.gateway.core import Gateway
from rollmesh.gateway.errors import (
    BackendDown,
    BackendUnavailable,
    InvalidGenerateRequest,
    InvalidSampling,
    ModelNotFound,
    PromptTooLong,
)
from rollmesh.gateway.types import GenerateInput, GenerateResult, SamplingInput
from rollmesh.mesh.chat import Message, ToolCall, ToolSpec
from rollmesh.mesh.server import ServiceBinding


def binding(gateway: Gateway) -> ServiceBinding:
    """The gateway's servicer, ready for `mesh.build_server`."""
    from rollmesh.gateway.servicer import GatewayServicer
    from rollmesh_client.v1 import gateway_pb2, gateway_pb2_grpc

    return ServiceBinding.of(gateway_pb2, gateway_pb2_grpc, "ModelGateway", GatewayServicer(gateway))


__all__ = [
    "BackendDown",
    "BackendUnavailable",
    "EngineChunk",
    "EngineRequest",
    "Gateway",
    "GatewayConfig",
    "GenerateInput",
    "GenerateResult",
    "InvalidGenerateRequest",
    "InvalidSampling",
    "Message",
    "ModelBackend",
    "ModelCard",
    "ModelNotFound",
    "ModelSpec",
    "PromptTooLong",
    "ReplicaStatus",
    "Sampling",
    "SamplingInput",
    "ServiceBinding",
    "Tokenizer",
    "ToolCall",
    "ToolSpec",
    "binding",
]
