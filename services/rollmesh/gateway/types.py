"""The gateway's domain types: what callers ask for and what they get back (no grpc, no HTTP).

The gRPC servicer (via convert.py) and the OpenAI HTTP facade both translate their wire formats
into these and call the same `Gateway` (core.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rollmesh.gateway.backend import ReplicaStatus


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    # Kept as text: a malformed call reaches the environment unchanged.
    arguments_json: str

    def arguments_key(self) -> str:
        """The arguments in a canonical form, for comparing two renderings of one call."""
        try:
            return json.dumps(json.loads(self.arguments_json), sort_keys=True, separators=(",", ":"))
        except ValueError:
            return self.arguments_json


@dataclass(frozen=True)
class Message:
    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""

    def to_template(self) -> dict[str, Any]:
        """The OpenAI-style dict a chat template (and an OpenAI server) expects."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out

    def same_turn(self, other: Message) -> bool:
        """True when `other` is this message as a client would echo it back (ids may differ)."""
        return (
            self.role == other.role
            and self.content == other.content
            and self.tool_call_id == other.tool_call_id
            and [(c.name, c.arguments_key()) for c in self.tool_calls]
            == [(c.name, c.arguments_key()) for c in other.tool_calls]
        )


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str = ""
    parameters_json: str = ""

    def to_openai(self) -> dict[str, Any]:
        params: Any = json.loads(self.parameters_json) if self.parameters_json else {"type": "object"}
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }


@dataclass(frozen=True)
class SamplingInput:
    """Sampling as the caller sent it: None means "the model's default"."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    ignore_eos: bool = False


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
