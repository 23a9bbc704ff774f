"""Channels to rollmesh services: one per target, keepalive on, and when a key is set the bearer
token on every call type (unary and streaming; see _auth.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rollmesh_client._auth import client_interceptors

MAX_MESSAGE_ENV = "ROLLMESH_MAX_MESSAGE_MB"
DEFAULT_MAX_MESSAGE_MB = 64

# Every rollmesh channel pings its server this often, idle or not, so long silent streams (a slow
# sink, a long generation) survive idle proxies.
KEEPALIVE_TIME_MS = 60_000

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.enable_retries", 0),
    # A restarted server is found within 2 s: grpc's default reconnect backoff grows to 120 s, and
    # while it waits every call fails UNAVAILABLE at once however long the server has been back.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


# What every rollmesh server (the services, a trainer's SinkServer) needs to accept those pings:
# grpc's server defaults refuse pings on a connection without calls and allow one per 5 min while no
# data flows, and answer the third early ping with GOAWAY too_many_pings, which cuts every stream on
# the connection (a sink stream idle for 3 min was cut that way). Servers ping back on the same clock.
SERVER_KEEPALIVE_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


def max_message_bytes() -> int:
    """The largest gRPC message a rollmesh client or server sends or takes, in bytes:
    `ROLLMESH_MAX_MESSAGE_MB` (default 64) MiB. Clients and servers read the same variable."""
    raw = os.environ.get(MAX_MESSAGE_ENV, "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_MAX_MESSAGE_MB
    except ValueError:
        raise ValueError(f"{MAX_MESSAGE_ENV}={raw!r} is not a number of MiB") from None
    if not 0 < mb < 2048:  # NaN too; gRPC's limits are 32-bit: 2 GiB - 1
        raise ValueError(f"{MAX_MESSAGE_ENV}={raw!r} must be above 0 and below 2048 (gRPC's 2 GiB)")
    return int(mb * 1024 * 1024)


def message_limit_options() -> list[tuple[str, Any]]:
    """grpc options setting both directions' message limit to `max_message_bytes()`."""
    limit = max_message_bytes()
    return [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]


@dataclass(frozen=True)
class ConnectConfig:
    """How to reach a service. `api_key` is sent as `authorization: Bearer <key>`."""

    address: str
    api_key: str | None = None
    timeout_s: float | None = 60.0


def check_address(address: str) -> str:
    """`address` when it is host:port with a port 1-65535, else ValueError saying so: gRPC took
    "h:99999" as port 34463 (another service, silently) and "http://h:1" as a name to resolve."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host.strip() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port (port 1-65535, no scheme), e.g. 127.0.0.1:50054")
    return address


def aio_channel(
    address: str, *, api_key: str | None = None, interceptors: Sequence[grpc.aio.ClientInterceptor] = ()
) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to `address` (host:port, checked) with the mesh's options; the
    bearer token's interceptors, then `interceptors` (e.g. the services' trace context)."""
    check_address(address)
    chain = [*(client_interceptors(api_key) if api_key else ()), *interceptors] or None
    options = [*CHANNEL_OPTIONS, *message_limit_options()]
    return grpc.aio.insecure_channel(address, options=options, interceptors=chain)
