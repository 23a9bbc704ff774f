"""Build, run and stop a grpc.aio server the same way for every service.

Health (`grpc.health.v1`) and reflection are always on, so `grpcurl -plaintext HOST:PORT list`
and `describe` work. With `ServerConfig.metrics_port` >= 0 (ROLLMESH_METRICS_PORT, `--metrics-port`),
`serve` also serves Prometheus metrics at http://HOST:PORT/metrics (mesh/metrics.py) on the same host.
On SIGTERM/SIGINT: every service NOT_SERVING, drain for the grace period, then the caller's `on_stop`
closes backends.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import socket
import sys
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2_grpc

from rollmesh.mesh import config
from rollmesh.mesh import tracing
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.heap import freeze_startup_heap
from rollmesh.mesh.interceptors import MeshInterceptor
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.metrics import MetricsEndpoint
from rollmesh.mesh.metrics import count_restarts
from rollmesh.mesh.metrics import metrics_file
from rollmesh.mesh.metrics import start_endpoint
from rollmesh_client._channel import SERVER_KEEPALIVE_OPTIONS
from rollmesh_client._channel import message_limit_options

log = get_logger("rollmesh.server")

SERVER_OPTIONS: list[tuple[str, Any]] = [
    # Long silent streams (a slow sink, a long generation) must survive idle proxies, and the
    # clients' keepalive pings must never be refused (shared with the SDK's SinkServer).
    *SERVER_KEEPALIVE_OPTIONS,
    # Two servers must never share a port.
    ("grpc.so_reuseport", 0),
    # grpc core sheds calls that arrived but that the application has not picked up yet: past
    # `max_pending_requests` (default 1000) it cancels them at random, and all of them past the hard
    # limit (default 3000) -- the client sees CANCELLED, details "CANCELLED" (Server's
    # `pending_backlog_protector_`, src/core/server/server.h). grpc.aio picks up one call at a
    # time from the event loop, so a burst of a few thousand concurrent calls (a scheduler running
    # 20,000 rollouts at once) overflows the defaults even though the handlers would keep up.
    # Callers bound their own concurrency (the scheduler's limiter), so queue them instead.
    ("grpc.server.max_pending_requests", 100_000),
    ("grpc.server.max_pending_requests_hard_limit", 200_000),
]


@dataclass(frozen=True)
class ServiceBinding:
    """One servicer and how to add it: `add` is the generated `add_XServicer_to_server`."""

    name: str
    servicer: Any
    add: Callable[[Any, grpc.aio.Server], None]

    @classmethod
    def of(cls, servicer: Any) -> ServiceBinding:
        """The binding of `servicer`, an instance of a generated `<Service>Servicer` subclass: the
        full name comes from the descriptor (what reflection and health advertise), the add function
        from the generated module, so no caller spells either out."""
        base = next(b for b in type(servicer).__mro__ if b.__module__.endswith("_pb2_grpc"))
        service = base.__name__.removesuffix("Servicer")
        pb2 = importlib.import_module(base.__module__.removesuffix("_grpc"))
        return cls(
            name=pb2.DESCRIPTOR.services_by_name[service].full_name,
            servicer=servicer,
            add=getattr(sys.modules[base.__module__], f"add_{service}Servicer_to_server"),
        )


class _Reflection(reflection.aio.ReflectionServicer):  # type: ignore[misc]
    """Server reflection that also finds a method by its full name (`grpcurl describe
    rollmesh.v1.ModelGateway.Generate`): protobuf's upb pool finds the files of services and messages,
    not of methods, so a method is answered with its service's file."""

    def _file_containing_symbol(self, request: Any, fully_qualified_name: str) -> Any:
        try:
            self._pool.FindFileContainingSymbol(fully_qualified_name)
        except KeyError:
            try:
                method = self._pool.FindMethodByName(fully_qualified_name)
            except KeyError:
                pass
            else:
                fully_qualified_name = method.containing_service.full_name
        return super()._file_containing_symbol(request, fully_qualified_name)


@dataclass
class MeshServer:
    server: grpc.aio.Server
    port: int
    host: str
    services: list[str]
    health: health.aio.HealthServicer
    _stopped: bool = field(default=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ["", *self.services]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float | None = 0) -> None:
        """NOT_SERVING everywhere, then stop accepting and drain for `grace` seconds."""
        if self._stopped:
            return
        self._stopped = True
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def build_server(
    bindings: Sequence[ServiceBinding], address: str = "127.0.0.1:0", *, api_key: str = ""
) -> MeshServer:
    """A server with the bindings, health, reflection and the mesh interceptor, bound to `address`.

    Port 0 picks a free port; the returned MeshServer says which.
    """
    try:
        options = [*SERVER_OPTIONS, *message_limit_options()]  # ROLLMESH_MAX_MESSAGE_MB
    except ValueError as exc:  # the SDK's reader: a configuration error here, one line at start
        raise ConfigError(str(exc)) from None
    server = grpc.aio.server(interceptors=[MeshInterceptor(api_key)], options=options)
    for b in bindings:
        b.add(b.servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [b.name for b in bindings]
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        _Reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME]), server
    )
    host = address.rpartition(":")[0]
    refuse_a_taken_port(address)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError:  # grpcio >= 1.66 raises where older ones returned 0
        port = 0
    if port == 0:  # a user error (exit 2, one line), not a crash
        raise ConfigError(f"could not bind {address}: is the port in use? (--port 0 picks a free one)")
    return MeshServer(server=server, port=port, host=host, services=names, health=health_servicer)


def refuse_a_taken_port(address: str, what: str = "", hint: str = "--port 0 picks a free one") -> None:
    """A port another process listens on is a one-line ConfigError before grpc core tries it (its own
    failure logs a C-level line and a RuntimeError): bound here as grpc binds (SO_REUSEADDR), then
    released. Port 0 and names that do not resolve are left to grpc."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            raise ConfigError(
                f"could not bind {what + ' ' if what else ''}{address} ({exc.strerror or exc}): "
                f"is the port in use? ({hint})"
            ) from None


async def serve(
    bindings: Sequence[ServiceBinding],
    server: config.ServerConfig,
    *,
    on_started: Callable[[MeshServer], Awaitable[None] | None] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run until SIGTERM or SIGINT, then drain for `server.grace_seconds` and stop (the shape of
    every `__main__`)."""
    # Its restarts so far (`rollmesh up`'s, or the starts ROLLMESH_STARTS_DIR counted; 0 on a first start)
    await asyncio.to_thread(count_restarts, server.service or "service")
    mesh_server = await build_server(bindings, server.address, api_key=server.api_key)
    tracing.configure(server.service or "service")  # when the OTEL_* variables ask (mesh/tracing.py)
    endpoint: MetricsEndpoint | None = None
    if server.metrics_port >= 0:
        endpoint = await asyncio.to_thread(start_endpoint, server.host, server.metrics_port)
    try:
        await _serve_started(mesh_server, server, endpoint, on_started=on_started, on_stop=on_stop)
    finally:
        if endpoint is not None:
            await asyncio.to_thread(endpoint.stop)
        await asyncio.to_thread(tracing.shutdown)  # sends the spans still buffered


async def _serve_started(
    mesh_server: MeshServer,
    server: config.ServerConfig,
    endpoint: MetricsEndpoint | None,
    *,
    on_started: Callable[[MeshServer], Awaitable[None] | None] | None,
    on_stop: Callable[[], Awaitable[None]] | None,
) -> None:
    grace = server.grace_seconds
    await mesh_server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals: list[signal.Signals] = []
    try:  # whatever fails from here on (a start hook that cannot bind its port) stops the server too
        log.info(
            "server_started",
            address=mesh_server.address,
            services=mesh_server.services,
            metrics=endpoint.url if endpoint is not None else "off",
        )
        port_file = str(config.read("ROLLMESH_PORT_FILE"))
        if port_file:
            if endpoint is not None:  # first: a parent that sees the port file can read this one
                write_port_file(metrics_file(port_file), endpoint.address)
            write_port_file(port_file, mesh_server.address)
        if on_started is not None:
            maybe = on_started(mesh_server)
            if maybe is not None:
                await maybe
        log.info("startup_heap_frozen", objects=freeze_startup_heap())  # heap.py
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
            signals.append(sig)
        await stop.wait()
        log.info("server_draining", grace_s=grace)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await mesh_server.stop(grace if signals else 0)
        if on_stop is not None:
            await on_stop()
        log.info("server_stopped", address=mesh_server.address)


def write_port_file(path: str, address: str) -> None:
    """Write `address` atomically, so a parent polling the file never reads half of it."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(address + "\n")
    os.replace(tmp, path)


async def wait_serving(address: str, *, timeout_s: float = 30.0, service: str = "") -> None:
    """Wait until `address` answers Health.Check with SERVING (for tests and `rollmesh status`)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"{address} did not report SERVING within {timeout_s:.0f}s")
            try:
                resp = await stub.Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=remaining, wait_for_ready=True
                )
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
            await asyncio.sleep(min(0.1, max(remaining, 0)))
