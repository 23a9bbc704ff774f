"""Channels to rollmesh services: one per target, keepalive on, bearer token attached when set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),
]


@dataclass(frozen=True)
class ConnectConfig:
    """How to reach a service. `api_key` is sent as `authorization: Bearer <key>`."""

    address: str
    api_key: str | None = None
    timeout_s: float | None = 60.0


class _AuthInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.aio.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, api_key: str) -> None:
        self._md = ("authorization", f"Bearer {api_key}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = list(details.metadata or [])
        md.append(self._md)
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*md),
            details.credentials,
            details.wait_for_ready,
        )

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_stream_unary(self, continuation: Callable[..., Any], details: Any, it: Any) -> Any:
        return await continuation(self._details(details), it)

    async def intercept_stream_stream(self, continuation: Callable[..., Any], details: Any, it: Any) -> Any:
        return await continuation(self._details(details), it)


def aio_channel(address: str, *, api_key: str | None = None) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to `address` (host:port) with the mesh's options."""
    interceptors = [_AuthInterceptor(api_key)] if api_key else None
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=interceptors)
