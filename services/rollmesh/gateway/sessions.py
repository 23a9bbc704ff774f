"""Token-exact multi-turn: the session store and the prompt builder (pure domain, no grpc).

Within a session the gateway keeps the exact ids of the previous turn (its prompt ids followed by
the ids the policy generated). The next prompt is built as

    next_ids = kept_ids + encode(closer_rest + suffix_text)

where
- `suffix_text` is what the chat template adds for the new messages (plus the generation prompt):
  render the whole conversation with the new messages (`add_generation_prompt=True`) and without
  them (`False`), and take the text after the shorter rendering. The shorter rendering must be a
  prefix of the longer one (true for append-only templates); otherwise the session starts fresh.
- `closer_rest` is the part of the template's assistant-turn closer (for tiny-arith `<|end|>\\n`,
  found by rendering a sentinel assistant message) that the policy did not generate itself, matched
  on ids (the kept ids' tail against the closer's ids): after an eos it is `\\n`; after a `length`
  stop it is the whole closer, even when the output ended with a character the closer starts with.

Invariant: `next_ids[:len(kept_ids)] == kept_ids`, always. Re-rendering the chat template can never
change a token the policy produced, even when the policy's tokenization of its own text is not the
tokenizer's canonical encoding (naive re-tokenization of the whole conversation would silently
replace those ids). Only the template text of the new messages is tokenized.

A turn extends the session when the request's messages start with the kept conversation (the
client echoes back the assistant message the gateway returned; tool-call ids and JSON spacing may
differ) and the model and tools are unchanged. Otherwise the session starts fresh (logged by the
caller) from a full rendering. Sessions are evicted after `ttl_s` without use and beyond
`max_sessions` (least recently used first).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections import OrderedDict
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollmesh.gateway.backends.base import Tokenizer
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolSpec

_SENTINEL = "\x00rollmesh-sentinel\x00"


@dataclass(frozen=True)
class SessionState:
    session_id: str
    model: str
    tools_key: str
    # The conversation so far, ending with the assistant message of the last turn.
    messages: tuple[Message, ...]
    # Prompt ids + output ids of the last turn, exactly as the engine saw and produced them.
    token_ids: tuple[int, ...]
    # Where the last turn ran, as the engine reported it (shown by ListModels). Placement itself is
    # the backend's: serving/router.py routes a session back to its replica; this only records it.
    replica_id: str = ""


@dataclass(frozen=True)
class Prompt:
    token_ids: tuple[int, ...]
    reused_prefix_tokens: int = 0
    # Why the prompt was rendered from scratch despite a kept session ("" when it was reused).
    fresh_reason: str = ""


def tools_key(tools: Sequence[ToolSpec]) -> str:
    return json.dumps([[t.name, t.description, t.parameters_json] for t in tools])


class SessionStore:
    """Sessions by id, LRU with a TTL and a cap. Single event loop; no locking needed."""

    def __init__(
        self,
        *,
        ttl_s: float = 3600.0,
        max_sessions: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._clock = clock
        self._items: OrderedDict[str, tuple[float, SessionState]] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._items)

    def _expire(self) -> None:
        cutoff = self._clock() - self.ttl_s
        while self._items:
            sid, (used, _) = next(iter(self._items.items()))
            if used > cutoff:
                break
            del self._items[sid]

    def get(self, session_id: str) -> SessionState | None:
        self._expire()
        item = self._items.get(session_id)
        if item is None:
            return None
        self._items[session_id] = (self._clock(), item[1])
        self._items.move_to_end(session_id)
        return item[1]

    def put(self, state: SessionState) -> None:
        self._items[state.session_id] = (self._clock(), state)
        self._items.move_to_end(state.session_id)
        self._expire()
        while len(self._items) > self.max_sessions:
            self._items.popitem(last=False)

    def close(self, session_id: str) -> bool:
        return self._items.pop(session_id, None) is not None

    def sessions_per_replica(self, model: str) -> Counter[str]:
        self._expire()
        return Counter(s.replica_id for _, s in self._items.values() if s.model == model and s.replica_id)


def render(
    tokenizer: Tokenizer,
    messages: Sequence[Message] | Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]],
    *,
    add_generation_prompt: bool,
) -> str:
    conv = [m.to_openai() if isinstance(m, Message) else m for m in messages]
    text = tokenizer.apply_chat_template(
        conv, tools=list(tools) or None, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    return str(text)


def naive_prompt_ids(
    tokenizer: Tokenizer, messages: Sequence[Message], tools: Sequence[ToolSpec]
) -> list[int]:
    """The whole conversation rendered and tokenized from scratch (what a fresh turn does)."""
    text = render(tokenizer, messages, [t.to_openai() for t in tools], add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def _extends(previous: SessionState, messages: Sequence[Message]) -> bool:
    kept = previous.messages
    return (
        len(messages) > len(kept)
        and bool(kept)
        and kept[-1].role == "assistant"
        and all(a.same_turn(b) for a, b in zip(kept, messages, strict=False))
    )


def _closer_rest(tokenizer: Tokenizer, previous: SessionState, tools: Sequence[dict[str, Any]]) -> str | None:
    """The text the template puts after an assistant turn's content that the policy did not emit."""
    probe = [*previous.messages[:-1], Message(role="assistant", content=_SENTINEL)]
    text = render(tokenizer, probe, tools, add_generation_prompt=False)
    at = text.rfind(_SENTINEL)
    if at < 0:
        return None
    closer = text[at + len(_SENTINEL) :]
    # Matched in ids, not characters: a turn cut right after a literal "<" did not emit "<|end|>".
    closer_ids = tokenizer.encode(closer, add_special_tokens=False)
    kept = previous.token_ids
    for k in range(min(len(closer_ids), len(kept)), 0, -1):
        if tuple(kept[-k:]) == tuple(closer_ids[:k]):
            return tokenizer.decode(closer_ids[k:], skip_special_tokens=False)
    return closer


class FreshPromptCache:
    """Prompt ids of conversations rendered from scratch, by (model, messages, tools), least
    recently used evicted beyond `max_entries`. A job asks each prompt once per sample (pass@k
    repeats, GRPO groups), and rendering a chat template costs more gateway CPU than everything
    else a short answer needs."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._max = max(1, max_entries)
        self._ids: OrderedDict[tuple[Any, ...], tuple[int, ...]] = OrderedDict()

    def ids(self, key: tuple[Any, ...], build: Callable[[], Sequence[int]]) -> tuple[int, ...]:
        found = self._ids.get(key)
        if found is not None:
            self._ids.move_to_end(key)
            return found
        made = tuple(build())
        self._ids[key] = made
        while len(self._ids) > self._max:
            self._ids.popitem(last=False)
        return made

    def __len__(self) -> int:
        return len(self._ids)


def build_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    previous: SessionState | None,
    *,
    model: str,
    fresh_cache: FreshPromptCache | None = None,
) -> Prompt:
    """The prompt ids for `messages`, reusing `previous`'s ids when the conversation extends it."""
    openai_tools = [t.to_openai() for t in tools]
    reason = "no_session"
    if previous is not None:
        reason = "history_rewritten"
        if previous.model != model:
            reason = "model_changed"
        elif previous.tools_key != tools_key(tools):
            reason = "tools_changed"
        elif _extends(previous, messages):
            kept_text = render(tokenizer, previous.messages, openai_tools, add_generation_prompt=False)
            # Render the kept messages as kept (the client's echo may differ in ids or JSON spacing).
            extended = (*previous.messages, *messages[len(previous.messages) :])
            next_text = render(tokenizer, extended, openai_tools, add_generation_prompt=True)
            rest = _closer_rest(tokenizer, previous, openai_tools)
            if next_text.startswith(kept_text) and rest is not None:
                added = tokenizer.encode(rest + next_text[len(kept_text) :], add_special_tokens=False)
                return Prompt(
                    token_ids=(*previous.token_ids, *added), reused_prefix_tokens=len(previous.token_ids)
                )
            reason = "template_not_append_only"

    if fresh_cache is None:
        return Prompt(token_ids=tuple(naive_prompt_ids(tokenizer, messages, tools)), fresh_reason=reason)
    key = (model, tuple(messages), tuple(tools))
    ids = fresh_cache.ids(key, lambda: naive_prompt_ids(tokenizer, messages, tools))
    return Prompt(token_ids=ids, fresh_reason=reason)
