"""The model backend ABC the gateway talks to. Ray Serve + vLLM, OpenAI-URL and fake backends
implement it; the gateway never branches on the backend's type.

The gateway owns chat templating and token-exact multi-turn: backends receive prompt token ids
(or, for `supports_token_ids = False` backends such as a remote OpenAI URL, chat messages) and
return generated token ids, logprobs and text.
"""

from __future__ import annotations

from abc import ABC
from abc import abstractmethod
from collections.abc import AsyncIterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Protocol

from rollmesh.gateway.errors import WeightUpdatesUnsupported


@dataclass(frozen=True)
class SamplingInput:
    """Sampling parameters as the caller sent them: None means "the model's default"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    # Generate exactly max_tokens (benchmarks, load tests); backends without it may ignore it.
    ignore_eos: bool = False


@dataclass(frozen=True)
class Sampling(SamplingInput):
    """The same parameters validated, each default filled in (`Gateway` validates them before a
    backend sees them): backends read these."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 256


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    sampling: Sampling
    # Exactly the ids the engine must see (token-exact backends).
    prompt_token_ids: tuple[int, ...] = ()
    # For backends that cannot take ids: OpenAI-style messages and tools.
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    # Replica affinity: requests of one session should land on one replica.
    session_id: str = ""
    # The caller consumes deltas as they come (GenerateStream). False (unary Generate): only the
    # whole output matters, and a backend may deliver it in one chunk (fewer hops per token); a
    # token-id backend may then leave `EngineChunk.text` empty when no stop strings are set (the
    # gateway decodes the token ids itself).
    stream: bool = True
    # W3C trace context of the gateway's span for this engine call ({} unless the trace is
    # sampled): a backend in another process (a Ray Serve replica) makes its span a child of it.
    trace_context: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineChunk:
    """A delta of generated output. The last chunk of a request has `finish_reason` set."""

    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    replica_id: str = ""
    # Backends that render the prompt themselves report the ids they used (may be empty).
    prompt_token_ids: tuple[int, ...] = ()
    # Token counts the engine reported (an OpenAI upstream's `usage`); 0 when it reported none.
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The weights the replica generated this from (Ray Serve replicas; serving/weights_record.py).
    weights_id: str = ""


@dataclass(frozen=True)
class ReplicaStatus:
    replica_id: str
    healthy: bool
    in_flight: int = 0
    sessions: int = 0
    # The weights the replica reports serving (Ray Serve replicas; serving/weights_record.py).
    weights_id: str = ""
    policy_version: str = ""
    # Requests its engine runs at once (vLLM's max_num_seqs); 0 when unknown.
    max_batch: int = 0


@dataclass(frozen=True)
class ModelCard:
    name: str
    backend: str  # "ray-serve", "openai", "fake"
    max_model_len: int
    extra: dict[str, Any] = field(default_factory=dict)


class Tokenizer(Protocol):
    """What the gateway needs from a tokenizer (a HF tokenizer satisfies it)."""

    def apply_chat_template(
        self,
        conversation: Sequence[dict[str, Any]],
        *,
        tools: Sequence[dict[str, Any]] | None = ...,
        add_generation_prompt: bool = ...,
        tokenize: bool = ...,
    ) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def __len__(self) -> int: ...  # ids are 0 to len - 1


class ModelBackend(ABC):
    """One served model. Lifecycle: `await start()`, generate/abort many times, `await shutdown()`."""

    #: True when the backend accepts `prompt_token_ids` (token-exact multi-turn works).
    supports_token_ids: bool = True

    @property
    @abstractmethod
    def card(self) -> ModelCard: ...

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer matching the engine, or None for message-only backends."""
        return None

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Stream deltas; the last has finish_reason. Raise gateway.errors.BackendUnavailable (or a
        more precise gateway error) when down.
        Cancelling the iteration must abort the engine request."""

    @abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Abort a running request; False when it was not running."""

    @abstractmethod
    async def replicas(self) -> list[ReplicaStatus]: ...

    @property
    def weights_path(self) -> Path | None:
        """The checkpoint folder the replicas serve now (what UpdateWeights validates a new one
        against); None when this backend cannot update weights."""
        return None

    async def load_weights(self, checkpoint: Path, *, policy_version: str = "") -> list[str]:
        """Load `checkpoint` (validated against `weights_path`) into every replica while no request
        runs, as the weights of `policy_version`; all or none: when a replica fails, the others are
        reloaded from the previous weights and `gateway.errors.WeightLoadFailed` is raised. Returns
        the replica ids updated. Replicas started later must serve these weights too."""
        raise WeightUpdatesUnsupported(f"the {self.card.backend} backend cannot update weights")

    async def check_health(self) -> bool:
        return any(r.healthy for r in await self.replicas())

    @abstractmethod
    async def shutdown(self) -> None: ...
