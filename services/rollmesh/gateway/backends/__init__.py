"""Model backends: the `ModelBackend` ABC (base), the fake, the OpenAI-URL backend (openai), and the
one place a backend name becomes an instance (factory). Ray Serve + vLLM lives in `rollmesh.serving`.
Heavy backends are imported only when `create_backend` needs them."""

from rollmesh.gateway.backends.base import (
    BackendUnavailable,
    EngineChunk,
    EngineRequest,
    ModelBackend,
    ModelCard,
    ReplicaStatus,
    Sampling,
    Tokenizer,
)
from rollmesh.gateway.backends.factory import create_backend, resolve_model_path

__all__ = [
    "BackendUnavailable",
    "EngineChunk",
    "EngineRequest",
    "ModelBackend",
    "ModelCard",
    "ReplicaStatus",
    "Sampling",
    "Tokenizer",
    "create_backend",
    "resolve_model_path",
]
