"""Chat types every service shares: `Message`, `ToolCall`, `ToolSpec`, content-part flattening, and
their conversion to and from OpenAI-style dicts and the `common.proto` messages (the only place either
conversion is written).

- Content is text. OpenAI / Responses content parts (`[{"type": "input_text", "text": ...}]`) become
  their texts joined (`content_text`); `strict=True` refuses non-text parts instead of dropping them.
- A tool call's arguments stay JSON text, so a malformed call reaches the environment unchanged.
- An assistant turn's reasoning is `reasoning`: None when the turn had none, "" for a reasoning step
  without text (hidden or encrypted). As an OpenAI dict it is `reasoning_content` (vLLM's name; its
  newer `reasoning` is read too).
- A tool's parameters are a JSON Schema, kept as JSON text (`parameters_json`, as on the wire);
  `parameters` is the parsed object (`{"type": "object"}` when none was given).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollmesh.mesh import untrusted_json
from rollmesh_client.v1 import common_pb2


def content_text(content: Any, *, strict: bool = False) -> str:
    """Message content as text: a string, or content parts' texts joined. With `strict`, a part
    without text (an image, audio) or content of another type raises ValueError."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, Mapping) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif strict:
                raise ValueError("only text content parts are supported")
        return "".join(parts)
    if strict:
        raise ValueError("content must be a string or a list of text parts")
    return str(content)


def _arguments(raw: Any) -> str:
    return raw if isinstance(raw, str) else json.dumps(raw if raw is not None else {})


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str

    def arguments_key(self) -> str:
        """The arguments in a canonical form, for comparing two renderings of one call."""
        try:
            parsed = untrusted_json.loads(self.arguments_json)
            return json.dumps(parsed, sort_keys=True, separators=(",", ":"))
        except ValueError:
            return self.arguments_json

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json},
        }

    @classmethod
    def from_openai(cls, raw: Mapping[str, Any]) -> ToolCall:
        """`{"id", "type", "function": {"name", "arguments"}}` (or the function's fields at the top)."""
        fn = raw.get("function")
        fn = fn if isinstance(fn, Mapping) else raw
        return cls(str(raw.get("id") or ""), str(fn.get("name") or ""), _arguments(fn.get("arguments")))


def reasoning_of(raw: Mapping[str, Any]) -> str | None:
    """An OpenAI-style message dict's reasoning (`reasoning_content`, else `reasoning`; None: none)."""
    for key in ("reasoning_content", "reasoning"):
        value = raw.get(key)
        if value is not None:
            return content_text(value)
    return None


@dataclass(frozen=True)
class Message:
    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    reasoning: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI-style dict a chat template (and an OpenAI server) expects."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        return out

    @classmethod
    def from_openai(cls, raw: Mapping[str, Any], *, strict: bool = False) -> Message:
        """An OpenAI-style message dict (content parts flattened; `strict` as in `content_text`)."""
        return cls(
            role=str(raw.get("role") or ""),
            content=content_text(raw.get("content"), strict=strict),
            tool_calls=tuple(
                ToolCall.from_openai(c) for c in raw.get("tool_calls") or () if isinstance(c, Mapping)
            ),
            tool_call_id=str(raw.get("tool_call_id") or ""),
            name=str(raw.get("name") or ""),
            reasoning=reasoning_of(raw),
        )

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

    @classmethod
    def of(cls, name: str, description: str, parameters: Mapping[str, Any]) -> ToolSpec:
        return cls(name, description, json.dumps(dict(parameters)))

    @functools.cached_property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema as an object (parsed once); ValueError when `parameters_json` is not JSON."""
        parsed: Any = (
            untrusted_json.loads(self.parameters_json) if self.parameters_json else {"type": "object"}
        )
        return parsed if isinstance(parsed, dict) else {"type": "object"}

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


# -- common.proto ----------------------------------------------------------------------------


def tool_call_from_pb(c: common_pb2.ToolCall) -> ToolCall:
    return ToolCall(c.id, c.name, c.arguments_json)


def message_from_pb(m: common_pb2.ChatMessage) -> Message:
    return Message(
        role=m.role,
        content=m.content,
        tool_calls=tuple(tool_call_from_pb(c) for c in m.tool_calls),
        tool_call_id=m.tool_call_id,
        name=m.name,
        reasoning=m.reasoning if m.HasField("reasoning") else None,
    )


def message_to_pb(m: Message) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(
        role=m.role,
        content=m.content,
        tool_calls=[
            common_pb2.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json) for c in m.tool_calls
        ],
        tool_call_id=m.tool_call_id,
        name=m.name,
        reasoning=m.reasoning,
    )


def openai_message_to_pb(raw: Mapping[str, Any]) -> common_pb2.ChatMessage:
    """`message_to_pb(Message.from_openai(raw))` without the `Message` in between (the scheduler
    sends every turn's messages this way). Only the fields the message has are set (an empty string
    is the field unset; `reasoning` has presence, so "" is set): 0.78 -> 0.46 us a plain message."""
    content = raw.get("content")
    msg = common_pb2.ChatMessage(
        role=str(raw.get("role") or ""),
        content=content if isinstance(content, str) else content_text(content),
    )
    if calls := raw.get("tool_calls"):
        msg.tool_calls.extend([_tool_call_pb(c) for c in calls if isinstance(c, Mapping)])
    if call_id := raw.get("tool_call_id"):
        msg.tool_call_id = str(call_id)
    if name := raw.get("name"):
        msg.name = str(name)
    if (reasoning := reasoning_of(raw)) is not None:
        msg.reasoning = reasoning
    return msg


def openai_message_from_pb(m: common_pb2.ChatMessage) -> dict[str, Any]:
    """`message_from_pb(m).to_openai()` without the `Message` in between (the scheduler reads every
    reply this way)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.name:
        out["name"] = m.name
    if m.HasField("reasoning"):
        out["reasoning_content"] = m.reasoning
    return out


def _tool_call_pb(raw: Mapping[str, Any]) -> common_pb2.ToolCall:
    c = ToolCall.from_openai(raw)
    return common_pb2.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json)


def tool_spec_from_pb(t: common_pb2.ToolSpec) -> ToolSpec:
    return ToolSpec(t.name, t.description, t.parameters_json)


def tool_spec_to_pb(t: ToolSpec) -> common_pb2.ToolSpec:
    return common_pb2.ToolSpec(name=t.name, description=t.description, parameters_json=t.parameters_json)
