"""Chat messages <-> OpenAI Responses items: the one place either direction is written.

A Responses conversation is a flat list of items; a chat is a list of messages. The mapping:

    Responses item                                   chat `Message`
    {"type": "reasoning", "summary": [texts]}        assistant `reasoning` (texts joined by a blank line;
                                                     no summary: the item's reasoning_text content)
    {"type": "message", "role": "assistant",         assistant `content` (text parts joined)
     "content": [{"type": "output_text", ...}]}
    {"type": "function_call", call_id, name,         assistant `tool_calls` (call_id is the call's id,
     arguments}                                      arguments stay JSON text)
    {"type": "function_call_output", call_id,        role "tool", `tool_call_id`
     output}
    {"type": "message", "role": user|system|developer, a message of that role
     "content": text or parts} (or no "type")

One assistant turn is reasoning, then text, then tool calls, each at most once and in that order
(`assistant_items` writes it so). Reading, consecutive assistant items fold into one turn while they
keep that order; an item that breaks it starts the next turn (two messages in a row, reasoning after
text or a call), so items -> messages -> items gives the same item types, roles, texts, reasoning,
calls and outputs in the same order. Item ids, statuses, annotations and per-item token ids are not
kept (a chat message has no home for them; rollmesh keeps its token record beside the response).
What cannot be read is one `NotResponsesItem` naming the item, never an item dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.chat import content_text
from rollmesh.mesh.chat import reasoning_of

# Roles a Responses message item may have besides "assistant".
_INPUT_ROLES = frozenset({"user", "system", "developer"})


class NotResponsesItem(ValueError):
    """An item that is not a Responses item rollmesh reads: `where` is its place (`[3]`, `[3].content`)."""

    def __init__(self, index: int, field: str, reason: str) -> None:
        super().__init__(f"[{index}]{field}: {reason}")
        self.index = index
        self.field = field
        self.where = f"[{index}]{field}"


# -- Responses items -> messages ---------------------------------------------------------------


def messages_from_items(items: Iterable[Any], *, default_role: str = "assistant") -> list[Message]:
    """The chat messages of Responses items (a response's `output`, or a request's `input` list with
    `default_role="user"` for message items that name no role)."""
    out: list[Message] = []
    # The assistant turn being read: what it holds so far, in the order reasoning < text < calls.
    turn: Message | None = None
    stage = 0  # 0: nothing yet, 1: reasoning read, 2: text read, 3: a call read

    def flush() -> None:
        nonlocal turn, stage
        if turn is not None:
            out.append(turn)
        turn, stage = None, 0

    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise NotResponsesItem(i, "", f"an item must be an object, not {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "reasoning":
            if stage >= 1:
                flush()
            turn, stage = Message("assistant", reasoning=_reasoning_text(item, i)), 1
        elif kind == "message":
            role = str(item.get("role") or default_role)
            text = _text(item.get("content"), i, ".content")
            if role != "assistant":
                if role not in _INPUT_ROLES:
                    raise NotResponsesItem(
                        i, ".role", f"role {role!r} is not user, system, developer or assistant"
                    )
                flush()
                out.append(Message(role, text))
                continue
            if stage >= 2:
                flush()
            base = turn or Message("assistant")
            turn, stage = Message("assistant", text, reasoning=base.reasoning), 2
        elif kind == "function_call":
            call = ToolCall.from_openai(
                {
                    "id": _str(item, "call_id", i),
                    "name": _str(item, "name", i),
                    "arguments": item.get("arguments"),
                }
            )
            base = turn or Message("assistant")
            turn = Message("assistant", base.content, (*base.tool_calls, call), reasoning=base.reasoning)
            stage = 3
        elif kind == "function_call_output":
            flush()
            out.append(
                Message(
                    "tool", _text(item.get("output"), i, ".output"), tool_call_id=_str(item, "call_id", i)
                )
            )
        else:
            raise NotResponsesItem(i, ".type", f"item type {kind!r} is not supported")
    flush()
    return out


def messages_from_input(value: Any, instructions: Any = None) -> list[Message]:
    """The chat messages of a Responses request's `input` (a string, or a list of items) after its
    `instructions` (a system message)."""
    msgs = [Message("system", str(instructions))] if instructions else []
    if isinstance(value, str):
        return [*msgs, Message("user", value)]
    if isinstance(value, list):
        return [*msgs, *messages_from_items(value, default_role="user")]
    raise ValueError(f"input must be a string or a list of items, not {type(value).__name__}")


def _text(content: Any, i: int, field: str) -> str:
    try:
        return content_text(content, strict=True)
    except ValueError as e:
        raise NotResponsesItem(i, field, str(e)) from None


def _str(item: Mapping[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise NotResponsesItem(i, f".{key}", f"must be a string, not {type(value).__name__}")
    return value


def _reasoning_text(item: Mapping[str, Any], i: int) -> str:
    summary = item.get("summary") or []
    if not isinstance(summary, list):
        raise NotResponsesItem(i, ".summary", "must be a list of summary parts")
    texts = [_text([part], i, ".summary") for part in summary]
    if not texts:
        texts = [_text([part], i, ".content") for part in item.get("content") or []]
    return "\n\n".join(texts)


# -- messages -> Responses items ---------------------------------------------------------------


def items_from_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Responses items of chat messages (what a response's `output` holds for an episode's turns).
    Ids are derived from the position and the call ids, so the same messages give the same items."""
    out: list[dict[str, Any]] = []
    for n, m in enumerate(messages):
        if m.role == "assistant":
            out.extend(assistant_items(m, f"{n}"))
        elif m.role == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "id": f"fco_{n}",
                    "call_id": m.tool_call_id,
                    "output": m.content,
                    "status": "completed",
                }
            )
        else:
            out.append({"type": "message", "role": m.role, "content": m.content})
    return out


def items_from_chat(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`items_from_messages` of OpenAI-style message dicts, read as `Message.from_openai` reads them
    (content parts flattened, a call's function fields, `reasoning_content` or `reasoning`) but
    without building the `Message`s: the same items, built once per stored rollout row."""
    out: list[dict[str, Any]] = []
    for n, raw in enumerate(messages):
        role = str(raw.get("role") or "")
        content = raw.get("content")
        text = content if isinstance(content, str) else content_text(content)
        if role == "assistant":
            calls = raw.get("tool_calls")
            _turn_items(
                out,
                text,
                reasoning_of(raw),
                [ToolCall.from_openai(c) for c in calls if isinstance(c, Mapping)] if calls else (),
                f"{n}",
            )
        elif role == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "id": f"fco_{n}",
                    "call_id": str(raw.get("tool_call_id") or ""),
                    "output": text,
                    "status": "completed",
                }
            )
        else:
            out.append({"type": "message", "role": role, "content": text})
    return out


def assistant_items(m: Message, suffix: str) -> list[dict[str, Any]]:
    """One assistant turn as Responses items: its reasoning, its text, its calls (each only when the
    turn has it; a turn with none of them is one empty text message). `suffix` makes the item ids."""
    out: list[dict[str, Any]] = []
    _turn_items(out, m.content, m.reasoning, m.tool_calls, suffix)
    return out


def _turn_items(
    out: list[dict[str, Any]], content: str, reasoning: str | None, calls: Sequence[ToolCall], suffix: str
) -> None:
    """Append one assistant turn's items to `out` (`assistant_items`)."""
    if reasoning is not None:
        summary = [{"type": "summary_text", "text": reasoning}] if reasoning else []
        out.append({"type": "reasoning", "id": f"rs_{suffix}", "summary": summary, "encrypted_content": None})
    if content or (not calls and reasoning is None):
        out.append(
            {
                "type": "message",
                "id": f"msg_{suffix}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": content, "annotations": []}],
            }
        )
    for k, c in enumerate(calls):
        out.append(
            {
                "type": "function_call",
                "id": f"fc_{c.id}" if c.id else f"fc_{suffix}_{k}",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments_json,
                "status": "completed",
            }
        )


def output_text(items: Sequence[Mapping[str, Any]]) -> str:
    """The `output_text` of a response: every assistant message's text parts joined (as the OpenAI
    SDK's `Response.output_text` computes it)."""
    texts: list[str] = []
    for item in items:
        content = item.get("content")
        if (
            item.get("type", "message") == "message"
            and item.get("role") == "assistant"
            and isinstance(content, list)
        ):
            texts.extend(
                str(p.get("text") or "")
                for p in content
                if isinstance(p, Mapping) and p.get("type") == "output_text"
            )
    return "".join(texts)


# -- whole responses ---------------------------------------------------------------------------

# Finish reasons OpenAI names an `incomplete_details.reason` for; any other reason that is not a
# normal end ("stop", "tool_calls") is incomplete with reason null.
_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_status(finish_reason: str) -> tuple[str, dict[str, Any] | None]:
    """A Responses object's `status` and `incomplete_details` for a chat finish reason."""
    if finish_reason in ("stop", "tool_calls"):
        return "completed", None
    return "incomplete", {"reason": _INCOMPLETE_REASONS.get(finish_reason)}


def response_object(
    output: list[dict[str, Any]],
    *,
    response_id: str,
    model: str,
    finish_reason: str,
    created_at: float = 0.0,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> dict[str, Any]:
    """A whole Responses object (what OpenAI's SDK and NeMo Gym's `NeMoGymResponse` validate) whose
    `output` is an episode's turns after its input, as items (`items_from_messages` of Messages,
    `items_from_chat` of a row's chat message dicts)."""
    status, incomplete = response_status(finish_reason)
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "model": model,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": None,
        "metadata": {},
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def response_messages(response: Mapping[str, Any]) -> list[Message]:
    """The chat messages of a Responses object's `output`. An output of transitions (a list of item
    lists, each the whole episode so far: NeMo Gym's aviary agent, `contains_transitions`) is read
    as its last transition."""
    output = response.get("output")
    if not isinstance(output, list):
        raise ValueError(f"response.output must be a list of items, not {type(output).__name__}")
    if output and all(isinstance(t, list) for t in output):
        output = output[-1]
    return messages_from_items(output)
