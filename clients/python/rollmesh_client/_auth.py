"""Bearer-token auth, both ends, for every call type.

Client: `client_interceptors(key)` returns one interceptor object per grpc.aio interface (unary-unary,
unary-stream, stream-unary, stream-stream). grpc.aio files an object that implements several
interfaces under the first one only, so a single all-in-one object would leave streaming calls
without the token.

Server: `authorized(method, metadata, key)` is the one check every rollmesh server makes (the mesh's
interceptor and the trainer's sink server): with a key set, a call must carry
`authorization: Bearer <key>` (the scheme in any case, as RFC 7235 says; the key compared in
constant time), except health and reflection, which answer
anyone so probes and `grpcurl list` work. `denying(handler)` turns a handler into one that aborts
with UNAUTHENTICATED (ErrorInfo reason UNAUTHENTICATED) without running the servicer.
`BearerAuthInterceptor` is that check as a whole server interceptor.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import grpc
from google.rpc import error_details_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

AUTH_HEADER = "authorization"
AUTH_EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
UNAUTHENTICATED_MESSAGE = (
    "missing or wrong bearer token: send metadata 'authorization: Bearer <ROLLMESH_API_KEY>'"
)
ERROR_DOMAIN = "rollmesh.dev"

Behavior = Callable[..., Any]


# -- client side -------------------------------------------------------------------------------


class _WithToken:
    def __init__(self, api_key: str) -> None:
        self._entry = (AUTH_HEADER, f"Bearer {api_key}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = grpc.aio.Metadata(*(details.metadata or ()))
        md.add(*self._entry)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, md, details.credentials, details.wait_for_ready
        )

    async def _intercept(self, continuation: Behavior, details: Any, request_or_requests: Any) -> Any:
        return await continuation(self._details(details), request_or_requests)


# One class per grpc.aio interface (module docstring), each with `_intercept` as its method.
_TOKEN_KINDS: list[Callable[[str], grpc.aio.ClientInterceptor]] = [
    type(f"_{base.__name__}Token", (_WithToken, base), {f"intercept_{call}": _WithToken._intercept})
    for call, base in (
        ("unary_unary", grpc.aio.UnaryUnaryClientInterceptor),
        ("unary_stream", grpc.aio.UnaryStreamClientInterceptor),
        ("stream_unary", grpc.aio.StreamUnaryClientInterceptor),
        ("stream_stream", grpc.aio.StreamStreamClientInterceptor),
    )
]


def client_interceptors(api_key: str) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors that send `authorization: Bearer <api_key>` on every call type."""
    return [kind(api_key) for kind in _TOKEN_KINDS]


# -- server side -------------------------------------------------------------------------------


def authorized(method: str, metadata: Sequence[tuple[str, Any]] | None, api_key: str) -> bool:
    """May this call run? Always without a key, and for health/reflection; else only with the token."""
    if not api_key or method.startswith(AUTH_EXEMPT_PREFIXES):
        return True
    for key, value in metadata or ():
        if key == AUTH_HEADER and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")  # the scheme is case-insensitive (RFC 7235)
            return scheme.lower() == "bearer" and hmac.compare_digest(
                token.strip().encode(), api_key.encode()
            )
    return False


def unauthenticated_status() -> grpc.Status:
    status = status_pb2.Status(code=grpc.StatusCode.UNAUTHENTICATED.value[0], message=UNAUTHENTICATED_MESSAGE)
    status.details.add().Pack(error_details_pb2.ErrorInfo(reason="UNAUTHENTICATED", domain=ERROR_DOMAIN))
    return rpc_status.to_status(status)


def rebuild(
    handler: grpc.RpcMethodHandler,
    wrap: Callable[[Behavior, bool], Behavior],
    *,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """`handler` with its behaviour replaced by `wrap(behaviour, response_streaming)` (and its
    request deserializer by `request_deserializer`, when given)."""
    kw = {
        "request_deserializer": request_deserializer or handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary, False), **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(wrap(handler.unary_stream, True), **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary, False), **kw)
    return grpc.stream_stream_rpc_method_handler(wrap(handler.stream_stream, True), **kw)


def denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """`handler`'s shape, but every call aborts with UNAUTHENTICATED."""

    async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        del request
        await context.abort_with_status(unauthenticated_status())

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await deny(request, context)
        yield  # pragma: no cover - abort raises first

    return rebuild(handler, lambda _behavior, streaming: deny_stream if streaming else deny)


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The auth check as a server interceptor (the trainer's `SinkServer` uses it as is). Subclasses
    wrap the calls it lets through (`admit`) and hear of refusals (`on_deny`): the mesh's does."""

    def __init__(self, api_key: str) -> None:
        self._api_key = api_key

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        method = details.method
        if handler is None or method.startswith(AUTH_EXEMPT_PREFIXES):
            return handler
        if not authorized(method, details.invocation_metadata, self._api_key):
            self.on_deny(method)
            return denying(handler)
        return self.admit(method, handler)

    def admit(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The handler that serves an authorized call to `method` (here: `handler` itself)."""
        del method
        return handler

    def on_deny(self, method: str) -> None:
        """Called once per refused call."""
