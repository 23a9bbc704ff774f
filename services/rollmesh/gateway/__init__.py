"""The model gateway: the only door to models (gRPC ModelGateway + an OpenAI-compatible HTTP facade)."""

from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.gateway.core import Gateway
from rollmesh.gateway.types import GenerateInput
from rollmesh.gateway.types import GenerateResult
from rollmesh.mesh.chat import Message

__all__ = [
    "Gateway",
    "GatewayConfig",
    "GenerateInput",
    "GenerateResult",
    "Message",
    "ModelSpec",
    "SamplingInput",
]
