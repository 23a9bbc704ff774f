"""The model gateway: the only door to models (gRPC ModelGateway + an OpenAI-compatible HTTP facade)."""

from rollmesh.gateway.backends.base import (
    EngineChunk,
    EngineRequest,
    ModelBackend,
    ModelCard,
    ReplicaStatus,
    Sampling,
    SamplingInput,
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
from rollmesh.gateway.types import GenerateInput, GenerateResult
from rollmesh.mesh.chat import Message, ToolCall, ToolSpec

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
]
