"""Parse `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks out of generated text.

A block whose body is a JSON object with a string `name` (and an object, or JSON text, as
`arguments`; missing means `{}`) becomes a `ToolCall` and is removed from the content. Anything
else (malformed JSON, no closing tag, no name) stays in the content verbatim and is not a call, so
the model's mistake is visible to the environment and can be scored. Text outside valid blocks is
kept exactly (no stripping), so the content is always the generated text minus the valid blocks.

A call's id is `call_<digest of the whole request id>_<i>` (`call_id_prefix`): unique wherever
request ids are (every call of a job: `<job>/<task>/<rollout>/<n>`; a call without one gets a random
request id), and the same for the same request id, so both agent drivers and a re-run give the same
ids. Agent SDKs key tool results by these ids and refuse a repeated one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.errors import NotJson

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class Parsed:
    content: str
    tool_calls: tuple[ToolCall, ...]


def _parse_body(body: str) -> tuple[str, str] | None:
    try:
        obj = untrusted_json.loads(body)
    except NotJson:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        return obj["name"], args
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def call_id_prefix(request_id: str) -> str:
    """`call_<18 hex digits>_`: a digest of all of `request_id` (a prefix of it would be shared by
    every request of a job)."""
    digest = hashlib.blake2b(request_id.encode(errors="surrogatepass"), digest_size=9)
    return f"call_{digest.hexdigest()}_"


def parse_tool_calls(text: str, *, id_prefix: str = "call_") -> Parsed:
    """Split `text` into content and tool calls; ids are `{id_prefix}{i}` in order of appearance."""
    if OPEN not in text:
        return Parsed(text, ())
    content: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            break
        end = text.find(CLOSE, start + len(OPEN))
        if end < 0:
            break
        parsed = _parse_body(text[start + len(OPEN) : end].strip())
        if parsed is None:
            # Malformed: keep the block as content and look for the next one after its opening tag.
            content.append(text[pos : start + len(OPEN)])
            pos = start + len(OPEN)
            continue
        content.append(text[pos:start])
        calls.append(ToolCall(id=f"{id_prefix}{len(calls)}", name=parsed[0], arguments_json=parsed[1]))
        pos = end + len(CLOSE)
    content.append(text[pos:])
    return Parsed("".join(content), tuple(calls))


class ContentStreamFilter:
    """Turns raw text deltas into content deltas that never show tool-call markup: text passes
    through until something that may start `<tool_call>` appears, then is held back until `finish`,
    which returns the rest of the parsed content. The parser keeps text before the first block
    verbatim, so what was streamed is always a prefix of the final content."""

    def __init__(self) -> None:
        self._raw: list[str] = []
        self._emitted = 0
        self._holding = False

    def feed(self, delta: str) -> str:
        self._raw.append(delta)
        if self._holding:
            return ""
        text = "".join(self._raw)
        start = text.find(OPEN, self._emitted)
        if start >= 0:
            self._holding = True
            safe_end = start
        else:
            safe_end = len(text)
            # Hold back a tail that could be the beginning of OPEN.
            for k in range(min(len(OPEN) - 1, len(text) - self._emitted), 0, -1):
                if text.endswith(OPEN[:k]):
                    safe_end = len(text) - k
                    break
        out = text[self._emitted : safe_end]
        self._emitted = max(self._emitted, safe_end)
        return out

    def finish(self, content: str) -> str:
        """The content not yet streamed, given the final parsed `content`."""
        streamed = "".join(self._raw)[: self._emitted]
        return content[len(streamed) :] if content.startswith(streamed) else ""
