"""The gateway's domain types: what callers ask for and what they get back (no grpc, no HTTP).

The gRPC servicer (via convert.py) and the OpenAI HTTP facade both translate their wire formats
into these and call the same `Gateway` (core.py). Chat messages and tools are the shared
`rollmesh.mesh.chat` types.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field

from rollmesh.gateway.backends.base import ReplicaStatus
from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.versions import VersionSpan


@dataclass(frozen=True)
class GenerateInput:
    model: str = ""
    messages: tuple[Message, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    sampling: SamplingInput = field(default_factory=SamplingInput)
    session_id: str = ""
    request_id: str = ""


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class GenerateResult:
    message: Message
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    usage: Usage
    replica_id: str
    policy_version: str
    model: str
    request_id: str
    reused_prefix_tokens: int = 0
    first_token_s: float = 0.0  # from arrival to the engine's first output (0: none)
    #: Which policy version produced which output ids, when more than one did (a CONTINUE weight
    #: update during the generation); `policy_version` is then the first (oldest).
    versions: tuple[VersionSpan, ...] = ()


@dataclass(frozen=True)
class StreamDelta:
    """Output produced since the previous delta of a streamed generation."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class ModelStatus:
    name: str
    backend: str
    replicas: tuple[ReplicaStatus, ...]  # in_flight and sessions as this gateway counts them
    max_model_len: int
    policy_version: str
    paused: bool
    is_default: bool


@dataclass(frozen=True)
class WeightUpdate:
    """The outcome of `Gateway.update_weights`."""

    policy_version: str
    previous_version: str
    replica_ids: tuple[str, ...]
    retried_requests: int
    paused_s: float
    checkpoint_path: str
    tensors: int
