"""The facade's routes (FastAPI): `/v1/models`, `/v1/models/{id}`, `/v1/chat/completions` and
`/v1/responses` (each unary or `stream: true`). A route parses with `protocol`, calls the same
`Gateway` the gRPC servicer uses, and answers with `protocol` or `streaming`; errors are the gateway's
`RollmeshError`s, answered with the HTTP status from `errors.http_status` (and `Retry-After` when the
error carries RetryInfo). With an API key, every `/v1/` route needs `Authorization: Bearer <key>`,
checked by the SDK's `authorized` (the same check every gRPC server makes).

Captures (gateway/captures.py) answer under `/capture/<key>/v1/` (`chat/completions`, `responses`,
`models`) with the capture's own bearer token instead of the API key: the same handlers, with the
capture's settings applied to each call and each answered call recorded.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncGenerator
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.responses import Response
from fastapi.responses import StreamingResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp
from starlette.types import Receive
from starlette.types import Scope
from starlette.types import Send

from rollmesh.gateway import errors
from rollmesh.gateway.captures import PATH_PREFIX
from rollmesh.gateway.captures import Capture
from rollmesh.gateway.core import Gateway
from rollmesh.gateway.http import protocol
from rollmesh.gateway.http import streaming
from rollmesh.gateway.types import GenerateInput
from rollmesh.gateway.types import GenerateResult
from rollmesh.gateway.types import StreamDelta
from rollmesh.mesh import untrusted_json
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.errors import Unauthenticated
from rollmesh_client import max_message_bytes
from rollmesh_client._auth import AUTH_HEADER
from rollmesh_client._auth import authorized

Record = Callable[[GenerateResult], None]
Answer = Callable[[dict[str, Any], GenerateInput, Record], Awaitable[Response]]


def error_response(exc: RollmeshError) -> JSONResponse:
    return JSONResponse(
        protocol.error_json(exc), status_code=errors.http_status(exc), headers=protocol.error_headers(exc)
    )


async def _body(request: Request) -> dict[str, Any]:
    limit, chunks, size = max_message_bytes(), [], 0
    async for chunk in request.stream():  # a 150 MB body was read, parsed and tokenized whole
        size += len(chunk)
        if size > limit:
            raise errors.BodyTooLarge(
                f"the request body is over {limit:,} bytes (ROLLMESH_MAX_MESSAGE_MB)",
                metadata={"limit": str(limit)},
            )
        chunks.append(chunk)
    try:
        body = untrusted_json.loads(b"".join(chunks))
    except ValueError as exc:  # NotJson, and UnicodeDecodeError for a body that is not UTF-8
        raise errors.bad_request(f"the body is not JSON ({exc})", "body") from None
    if not isinstance(body, dict):
        raise errors.bad_request("the body must be a JSON object", "body")
    return body


async def _first(
    stream: AsyncGenerator[StreamDelta | GenerateResult, None],
) -> StreamDelta | GenerateResult:
    """The first item, so errors before any output become a proper HTTP error, not an in-band one."""
    try:
        return await anext(stream)
    except BaseException:
        await stream.aclose()
        raise


async def _recorded(
    stream: AsyncGenerator[StreamDelta | GenerateResult, None], record: Record | None
) -> AsyncGenerator[StreamDelta | GenerateResult, None]:
    """`stream` as it is, handing its result to `record` (a capture's) as it passes."""
    async with contextlib.aclosing(stream):
        async for item in stream:
            if record is not None and isinstance(item, GenerateResult):
                record(item)
            yield item


class _ApiKey:
    """With an API key, every `/v1/` route needs `Authorization: Bearer <key>` (401 otherwise). Plain
    ASGI: `@app.middleware("http")` (BaseHTTPMiddleware) ran each request in a task group of its own,
    a cost on every call a capture's program makes."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path.startswith("/v1/"):
            given = Headers(scope=scope).get(AUTH_HEADER, "")
            if not authorized(path, [(AUTH_HEADER, given)], self.api_key):
                await error_response(Unauthenticated("missing or wrong bearer token"))(scope, receive, send)
                return
        await self.app(scope, receive, send)


_CAPTURE_CALL = re.compile(rf"{PATH_PREFIX}/([^/]+)/v1/(chat/completions|responses)")


class _CaptureCalls:
    """`POST /capture/<key>/v1/chat/completions` and `.../responses`, answered ahead of FastAPI's
    router: a capture's program makes each model call of its rollout there, and the router's layers
    (route matching, dependency solving, exit stacks) cost about as much again as the call's own
    parsing and answer. Errors are answered as on every route (`error_response`); another method or
    path goes on to the router."""

    def __init__(self, app: ASGIApp, handle: Callable[[Request, str, str], Awaitable[Response]]) -> None:
        self.app = app
        self.handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _CAPTURE_CALL.fullmatch(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        try:
            response = await self.handle(Request(scope, receive), match[1], match[2])
        except RollmeshError as exc:
            response = error_response(exc)
        await response(scope, receive, send)


def build_app(gateway: Gateway, *, api_key: str = "") -> FastAPI:
    app = FastAPI(title="rollmesh gateway (OpenAI-compatible)", docs_url=None, redoc_url=None)

    @app.exception_handler(RollmeshError)
    async def _rollmesh_error(request: Request, exc: RollmeshError) -> Response:
        return error_response(exc)

    if api_key:
        app.add_middleware(_ApiKey, api_key=api_key)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [protocol.model_json(m) for m in await gateway.list_models()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        for m in await gateway.list_models():
            if m.name == model_id:
                return protocol.model_json(m)
        raise errors.ModelNotFound(f"no model or route named {model_id!r}", metadata={"model": model_id})

    async def chat(body: dict[str, Any], inp: GenerateInput, record: Record | None = None) -> Response:
        if not body.get("stream"):
            result = await gateway.generate(inp)
            if record is not None:
                record(result)
            return JSONResponse(protocol.chat_completion(result, inp.session_id))
        stream = _recorded(gateway.generate_stream(inp), record)
        first = await _first(stream)
        sse = streaming.chat_events(
            first,
            stream,
            model=inp.model or gateway.default_model,
            session_id=inp.session_id,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        )
        return StreamingResponse(sse, media_type="text/event-stream")

    async def responses(body: dict[str, Any], inp: GenerateInput, record: Record | None = None) -> Response:
        if not body.get("stream"):
            result = await gateway.generate(inp)
            if record is not None:
                record(result)
            return JSONResponse(protocol.response_object(result, body, inp.session_id))
        stream = _recorded(gateway.generate_stream(inp), record)
        first = await _first(stream)
        sse = streaming.response_events(
            first, stream, body=body, model=inp.model or gateway.default_model, session_id=inp.session_id
        )
        return StreamingResponse(sse, media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_route(request: Request) -> Response:
        body = await _body(request)
        return await chat(body, protocol.chat_input(request.headers, body))

    @app.post("/v1/responses")
    async def responses_route(request: Request) -> Response:
        body = await _body(request)
        return await responses(body, protocol.responses_input(request.headers, body))

    # -- captures (gateway/captures.py): an external agent program's per-rollout URL --

    def capture_of(request: Request, key: str) -> Capture:
        scheme, _, token = request.headers.get(AUTH_HEADER, "").strip().partition(" ")
        return gateway.captures.get(key, token.strip() if scheme.lower() == "bearer" else "")

    async def captured(
        request: Request, key: str, api: str, parse: Callable[..., GenerateInput], answer: Answer
    ) -> Response:
        capture = capture_of(request, key)
        try:
            body = await _body(request)
            asked = parse(request.headers, body)
            inp = capture.apply(asked)
        except RollmeshError:
            capture.refused += 1
            raise
        try:
            record = functools.partial(capture.record, api, inp, requested_model=asked.model)
            return await answer(body, inp, record)
        except BaseException:
            capture.refused += 1
            raise

    @app.get(f"{PATH_PREFIX}/{{key}}/v1/models")
    async def capture_models(request: Request, key: str) -> dict[str, Any]:
        capture = capture_of(request, key)
        served = [
            m for m in await gateway.list_models() if m.name == (capture.model or gateway.default_model)
        ]
        return {"object": "list", "data": [protocol.model_json(m) for m in served]}

    async def capture_call(request: Request, key: str, route: str) -> Response:
        if route == "responses":
            return await captured(request, key, "responses", protocol.responses_input, responses)
        return await captured(request, key, "chat.completions", protocol.chat_input, chat)

    app.add_middleware(_CaptureCalls, handle=capture_call)
    return app
