"""Server-sent event streams for the HTTP facade: chat completion chunks, and the Responses API's
typed events (`response.created` ... `response.completed`), both built from the gateway's stream of
`StreamDelta`s ending in a `GenerateResult`.

Text deltas pass through `ContentStreamFilter`, so tool-call markup never reaches a client as text;
tool calls arrive whole after the text. A failure after the first byte is reported in-band (chat: an
OpenAI error object; Responses: a `response.failed` event) and the stream ends. Closing the stream
closes the gateway's generation (which aborts the engine request).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from typing import Any

from rollmesh.gateway.http.protocol import calls_json
from rollmesh.gateway.http.protocol import chat_finish
from rollmesh.gateway.http.protocol import completion_object
from rollmesh.gateway.http.protocol import error_json
from rollmesh.gateway.http.protocol import extension
from rollmesh.gateway.http.protocol import logprobs_json
from rollmesh.gateway.http.protocol import response_object
from rollmesh.gateway.http.protocol import response_shell
from rollmesh.gateway.http.protocol import usage_json
from rollmesh.gateway.toolcalls import ContentStreamFilter
from rollmesh.gateway.types import GenerateResult
from rollmesh.gateway.types import StreamDelta
from rollmesh.mesh.errors import RollmeshError

Items = AsyncGenerator[StreamDelta | GenerateResult, None]


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def chat_events(
    first: StreamDelta | GenerateResult,
    rest: Items,
    *,
    model: str,
    session_id: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(
        delta: dict[str, Any],
        finish: str | None = None,
        *,
        answer: GenerateResult | None = None,
        **extra: Any,
    ) -> bytes:
        """One choice's `delta`; `answer` (the final `GenerateResult`) adds the rollmesh fields."""
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
        if answer is None:
            return _sse(completion_object(cid, model, [choice], created=created, chunk=True))
        more = {"prompt_token_ids": list(answer.prompt_token_ids), "rollmesh": extension(answer, session_id)}
        return _sse(completion_object(cid, answer.model, [choice], created=created, chunk=True, **more))

    filt = ContentStreamFilter()
    yield chunk({"role": "assistant", "content": ""})
    item: StreamDelta | GenerateResult | None = first
    try:
        while item is not None:
            if isinstance(item, GenerateResult):
                r = item
                rest_text = filt.finish(r.message.content)
                if rest_text:
                    yield chunk({"content": rest_text})
                if r.message.tool_calls:
                    calls = [{"index": i, **c} for i, c in enumerate(calls_json(r))]
                    yield chunk({"tool_calls": calls})
                yield chunk({}, chat_finish(r.finish_reason), answer=r)
                if include_usage:
                    usage = usage_json(r)
                    yield _sse(completion_object(cid, r.model, [], created=created, chunk=True, usage=usage))
                break
            text = filt.feed(item.text)
            if text or item.token_ids:
                logprobs = logprobs_json(item.token_ids, item.logprobs)
                yield chunk({"content": text}, token_ids=list(item.token_ids), logprobs=logprobs)
            item = await anext(rest, None)
    except RollmeshError as exc:
        # Headers are gone; report the error in-band as OpenAI does, then end the stream.
        yield _sse(error_json(exc))
    finally:
        await rest.aclose()
    yield b"data: [DONE]\n\n"


async def response_events(
    first: StreamDelta | GenerateResult, rest: Items, *, body: dict[str, Any], model: str, session_id: str
) -> AsyncIterator[bytes]:
    """The Responses API stream: created, in_progress, the message item's text deltas, then each
    function call item, then `response.completed` carrying the same object a unary call returns."""
    rid = f"resp_{uuid.uuid4().hex}"
    seq = itertools.count()

    def event(kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": next(seq), **fields}
        return f"event: {kind}\ndata: {json.dumps(obj)}\n\n".encode()

    shell = response_shell(rid, model, body)
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    msg_id = f"msg_{uuid.uuid4().hex}"
    where = {"item_id": msg_id, "output_index": 0, "content_index": 0}
    opened = False

    def open_message() -> list[bytes]:
        """The message item's opening events, the first time only."""
        nonlocal opened
        if opened:
            return []
        opened = True
        item = {"type": "message", "id": msg_id, "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            event("response.output_item.added", output_index=0, item=item),
            event("response.content_part.added", **where, part=part),
        ]

    filt = ContentStreamFilter()
    item: StreamDelta | GenerateResult | None = first
    try:
        while item is not None:
            if isinstance(item, GenerateResult):
                final = response_object(item, body, session_id)
                final["id"] = rid
                rest_text = filt.finish(item.message.content)
                if any(o["type"] == "message" for o in final["output"]):
                    for b in open_message():
                        yield b
                if rest_text and opened:
                    yield event("response.output_text.delta", **where, delta=rest_text, logprobs=[])
                for index, out in enumerate(final["output"]):
                    if out["type"] == "message":
                        out["id"] = msg_id
                        text = item.message.content
                        part = {"type": "output_text", "text": text, "annotations": []}
                        yield event("response.output_text.done", **where, text=text, logprobs=[])
                        yield event("response.content_part.done", **where, part=part)
                    else:
                        added = {**out, "arguments": "", "status": "in_progress"}
                        yield event("response.output_item.added", output_index=index, item=added)
                        yield event(
                            "response.function_call_arguments.delta",
                            item_id=out["id"],
                            output_index=index,
                            delta=out["arguments"],
                        )
                        yield event(
                            "response.function_call_arguments.done",
                            item_id=out["id"],
                            output_index=index,
                            name=out["name"],
                            arguments=out["arguments"],
                        )
                    yield event("response.output_item.done", output_index=index, item=out)
                kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
                yield event(kind, response=final)
                break
            text = filt.feed(item.text)
            if text:
                for b in open_message():
                    yield b
                yield event("response.output_text.delta", **where, delta=text, logprobs=[])
            item = await anext(rest, None)
    except RollmeshError as exc:
        failed = {**shell, "status": "failed", "error": {"code": exc.reason, "message": exc.message}}
        yield event("response.failed", response=failed)
    finally:
        await rest.aclose()
