"""The OpenAI-compatible HTTP facade: `/v1/chat/completions` (+ SSE), `/v1/responses`, `/v1/models`.

Routes translate OpenAI JSON to the gateway's domain types and call the same `Gateway` the gRPC
servicer uses; errors are the same `RollmeshError` classes, answered as OpenAI-style JSON
(`{"error": {"message", "type", "param", "code"}}`, `code` = the ErrorInfo reason) with the HTTP
status from `errors.http_status` (and `Retry-After` when the error carries RetryInfo).

Extensions for RL agents that only speak HTTP:
- `X-Session-Id` header (or the `user` field) names a gateway session: token-exact multi-turn.
- Responses carry `prompt_token_ids` (top level) and `token_ids` (per choice) as vLLM's
  `return_token_ids` does, plus `rollmesh: {replica_id, policy_version, reused_prefix_tokens, ...}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rollmesh.gateway import errors
from rollmesh.gateway.core import Gateway
from rollmesh.gateway.toolcalls import ContentStreamFilter
from rollmesh.gateway.types import (
    GenerateInput,
    GenerateResult,
    Message,
    SamplingInput,
    StreamDelta,
    ToolCall,
    ToolSpec,
)
from rollmesh.mesh.errors import RollmeshError, Unauthenticated
from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.gateway.http")


def _bad(message: str, param: str) -> errors.InvalidGenerateRequest:
    return errors.InvalidGenerateRequest(message, metadata={"field": param})


def error_response(exc: RollmeshError) -> JSONResponse:
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    body = {
        "error": {
            "message": exc.message,
            "type": errors.openai_type(exc),
            "param": exc.metadata.get("field"),
            "code": exc.reason,
        }
    }
    return JSONResponse(body, status_code=errors.http_status(exc), headers=headers)


# -- OpenAI JSON -> domain -----------------------------------------------------------------------


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise _bad(f"{where}: only text content parts are supported", where)
        return "".join(parts)
    raise _bad(f"{where} must be a string or a list of text parts", where)


def _arguments(raw: Any) -> str:
    return raw if isinstance(raw, str) else json.dumps(raw)


def chat_message(m: Any, i: int) -> Message:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise _bad(f"messages[{i}] must be an object with a role", f"messages[{i}]")
    calls = tuple(
        ToolCall(
            id=str(c.get("id", "")),
            name=str((c.get("function") or {}).get("name", "")),
            arguments_json=_arguments((c.get("function") or {}).get("arguments", "{}")),
        )
        for c in m.get("tool_calls") or ()
    )
    return Message(
        role=m["role"],
        content=_text(m.get("content"), f"messages[{i}].content"),
        tool_calls=calls,
        tool_call_id=str(m.get("tool_call_id") or ""),
        name=str(m.get("name") or ""),
    )


def _tools(raw: Any) -> tuple[ToolSpec, ...]:
    out = []
    for i, t in enumerate(raw or ()):
        fn = t.get("function", t) if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not fn.get("name"):
            raise _bad(f"tools[{i}] must be a function tool with a name", f"tools[{i}]")
        params = fn.get("parameters")
        out.append(
            ToolSpec(
                name=str(fn["name"]),
                description=str(fn.get("description") or ""),
                parameters_json=json.dumps(params) if params is not None else "",
            )
        )
    return tuple(out)


def _sampling(body: dict[str, Any], max_key: tuple[str, ...]) -> SamplingInput:
    def num(key: str) -> float | None:
        v = body.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise errors.InvalidSampling(f"{key} must be a number", metadata={"field": key})
        return float(v)

    max_tokens = next((body[k] for k in max_key if body.get(k) is not None), None)
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)):
        raise errors.InvalidSampling(f"{max_key[0]} must be an integer", metadata={"field": max_key[0]})
    stop = body.get("stop") or ()
    top_k = body.get("top_k")
    seed = body.get("seed")
    return SamplingInput(
        temperature=num("temperature"),
        top_p=num("top_p"),
        top_k=int(top_k) if isinstance(top_k, int) else None,
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(str(s) for s in stop),
        seed=int(seed) if isinstance(seed, int) else None,
        logprobs=bool(body.get("logprobs")),
        ignore_eos=bool(body.get("ignore_eos")),  # vLLM's extension of the OpenAI API
    )


def _session(request: Request, body: dict[str, Any]) -> str:
    return request.headers.get("x-session-id") or str(body.get("session_id") or body.get("user") or "")


def chat_input(request: Request, body: dict[str, Any]) -> GenerateInput:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages must be a non-empty list", "messages")
    if (body.get("n") or 1) != 1:
        raise _bad("n > 1 is not supported; send n requests", "n")
    return GenerateInput(
        model=str(body.get("model") or ""),
        messages=tuple(chat_message(m, i) for i, m in enumerate(msgs)),
        tools=_tools(body.get("tools")),
        sampling=_sampling(body, ("max_completion_tokens", "max_tokens")),
        session_id=_session(request, body),
        request_id=request.headers.get("x-request-id", ""),
    )


def responses_input(request: Request, body: dict[str, Any]) -> GenerateInput:
    if body.get("previous_response_id"):
        raise _bad(
            "previous_response_id is not supported; send the whole input with an X-Session-Id header",
            "previous_response_id",
        )
    msgs: list[Message] = []
    if body.get("instructions"):
        msgs.append(Message(role="system", content=str(body["instructions"])))
    raw = body.get("input")
    if isinstance(raw, str):
        msgs.append(Message(role="user", content=raw))
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            if not isinstance(item, dict):
                raise _bad(f"input[{i}] must be an object", f"input[{i}]")
            kind = item.get("type", "message")
            if kind == "message":
                msgs.append(
                    Message(
                        role=str(item.get("role", "user")), content=_text(item.get("content"), f"input[{i}]")
                    )
                )
            elif kind == "function_call":
                call = ToolCall(
                    id=str(item.get("call_id", "")),
                    name=str(item.get("name", "")),
                    arguments_json=_arguments(item.get("arguments", "{}")),
                )
                if msgs and msgs[-1].role == "assistant":
                    last = msgs.pop()
                    msgs.append(Message("assistant", last.content, (*last.tool_calls, call)))
                else:
                    msgs.append(Message("assistant", "", (call,)))
            elif kind == "function_call_output":
                msgs.append(
                    Message(
                        role="tool",
                        content=_text(item.get("output"), f"input[{i}].output"),
                        tool_call_id=str(item.get("call_id", "")),
                    )
                )
            else:
                raise _bad(f"input[{i}]: item type {kind!r} is not supported", f"input[{i}].type")
    else:
        raise _bad("input must be a string or a list of items", "input")
    if not msgs:
        raise _bad("input is empty", "input")
    return GenerateInput(
        model=str(body.get("model") or ""),
        messages=tuple(msgs),
        tools=_tools(body.get("tools")),
        sampling=_sampling(body, ("max_output_tokens",)),
        session_id=_session(request, body),
        request_id=request.headers.get("x-request-id", ""),
    )


# -- domain -> OpenAI JSON -----------------------------------------------------------------------


def _calls_json(r: GenerateResult) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
        for c in r.message.tool_calls
    ]


def _extension(r: GenerateResult, session_id: str) -> dict[str, Any]:
    return {
        "replica_id": r.replica_id,
        "policy_version": r.policy_version,
        "reused_prefix_tokens": r.reused_prefix_tokens,
        "request_id": r.request_id,
        "session_id": session_id,
    }


def _logprobs(r: GenerateResult) -> dict[str, Any] | None:
    if not r.logprobs:
        return None
    return {
        "content": [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(r.output_token_ids, r.logprobs, strict=False)
        ]
    }


def _usage(r: GenerateResult) -> dict[str, int]:
    u = r.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }


def chat_completion(r: GenerateResult, session_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": r.message.content or None}
    if r.message.tool_calls:
        message["tool_calls"] = _calls_json(r)
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": f"chatcmpl-{r.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": r.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": r.finish_reason,
                "logprobs": _logprobs(r),
                "token_ids": list(r.output_token_ids),
            }
        ],
        "usage": _usage(r),
        "prompt_token_ids": list(r.prompt_token_ids),
        "rollmesh": _extension(r, session_id),
    }


def response_object(r: GenerateResult, body: dict[str, Any], session_id: str) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if r.message.content or not r.message.tool_calls:
        output.append(
            {
                "type": "message",
                "id": f"msg_{r.request_id}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": r.message.content, "annotations": []}],
            }
        )
    for c in r.message.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{c.id}",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments_json,
                "status": "completed",
            }
        )
    incomplete = r.finish_reason == "length"
    return {
        "id": f"resp_{r.request_id}",
        "object": "response",
        "created_at": time.time(),
        "model": r.model,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "usage": {
            "input_tokens": r.usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": r.reused_prefix_tokens},
            "output_tokens": r.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": r.usage.total_tokens,
        },
        "prompt_token_ids": list(r.prompt_token_ids),
        "output_token_ids": list(r.output_token_ids),
        "rollmesh": _extension(r, session_id),
    }


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


async def _chat_sse(
    first: StreamDelta | GenerateResult,
    rest: AsyncGenerator[StreamDelta | GenerateResult, None],
    *,
    model: str,
    session_id: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
        return _sse(
            {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [choice],
            }
        )

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
                    calls = [{"index": i, **c} for i, c in enumerate(_calls_json(r))]
                    yield chunk({"tool_calls": calls})
                final = {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": r.model,
                    "choices": [
                        {"index": 0, "delta": {}, "finish_reason": r.finish_reason, "logprobs": None}
                    ],
                    "prompt_token_ids": list(r.prompt_token_ids),
                    "rollmesh": _extension(r, session_id),
                }
                yield _sse(final)
                if include_usage:
                    yield _sse(
                        {
                            "id": cid,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": r.model,
                            "choices": [],
                            "usage": _usage(r),
                        }
                    )
                break
            text = filt.feed(item.text)
            if text or item.token_ids:
                yield chunk({"content": text}, token_ids=list(item.token_ids))
            item = await anext(rest, None)
    except RollmeshError as exc:
        # Headers are gone; report the error in-band as OpenAI does, then end the stream.
        yield _sse(json.loads(bytes(error_response(exc).body)))
    finally:
        await rest.aclose()
    yield b"data: [DONE]\n\n"


def build_app(gateway: Gateway, *, api_key: str = "") -> FastAPI:
    app = FastAPI(title="rollmesh gateway (OpenAI-compatible)", docs_url=None, redoc_url=None)

    @app.exception_handler(RollmeshError)
    async def _rollmesh_error(request: Request, exc: RollmeshError) -> Response:
        return error_response(exc)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Response:
        if api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return error_response(Unauthenticated("missing or wrong bearer token"))
        response: Response = await call_next(request)
        return response

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise _bad("the body is not JSON", "body") from None
        if not isinstance(body, dict):
            raise _bad("the body must be a JSON object", "body")
        return body

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        data = [
            {
                "id": m.name,
                "object": "model",
                "created": 0,
                "owned_by": "rollmesh",
                "max_model_len": m.max_model_len,
                "rollmesh": {
                    "backend": m.backend,
                    "policy_version": m.policy_version,
                    "paused": m.paused,
                    "is_default": m.is_default,
                    "replicas": [r.__dict__ for r in m.replicas],
                },
            }
            for m in await gateway.list_models()
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await body_of(request)
        inp = chat_input(request, body)
        if not body.get("stream"):
            return JSONResponse(chat_completion(await gateway.generate(inp), inp.session_id))
        stream = gateway.generate_stream(inp)
        try:
            first = await anext(stream)  # errors before any output become a proper HTTP error
        except BaseException:
            await stream.aclose()
            raise
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        sse = _chat_sse(
            first,
            stream,
            model=inp.model or gateway.default_model,
            session_id=inp.session_id,
            include_usage=include_usage,
        )
        return StreamingResponse(sse, media_type="text/event-stream")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await body_of(request)
        if body.get("stream"):
            raise _bad("streaming is not supported on /v1/responses; use /v1/chat/completions", "stream")
        inp = responses_input(request, body)
        return JSONResponse(response_object(await gateway.generate(inp), body, inp.session_id))

    return app


class HttpFacade:
    """The facade's uvicorn server on the gateway's event loop (no signal handlers of its own:
    the gateway's `mesh.serve` owns SIGTERM and stops this with the gRPC server)."""

    def __init__(
        self, gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0, api_key: str = ""
    ) -> None:
        config = uvicorn.Config(
            build_app(gateway, api_key=api_key),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None
        self.host = host
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        config = self._server.config
        if not config.loaded:
            config.load()
        self._server.lifespan = config.lifespan_class(config)
        try:
            await self._server.startup()
        except SystemExit:
            raise OSError(f"could not bind the OpenAI HTTP facade to {self.host}:{self.port}") from None
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        self._task = asyncio.create_task(self._server.main_loop(), name="openai-http")
        log.info("openai_http_started", url=self.base_url)
        return self.port

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self._server.shutdown()
        log.info("openai_http_stopped", url=self.base_url)
