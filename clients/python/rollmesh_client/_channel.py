"""Channels to rollmesh services: one per target, keepalive on, and when a key is set the bearer
token on every call type (unary and streaming; see _auth.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from rollmesh_client._auth import client_interceptors

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


def aio_channel(address: str, *, api_key: str | None = None) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to `address` (host:port) with the mesh's options."""
    interceptors = client_interceptors(api_key) if api_key else None
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=interceptors)
