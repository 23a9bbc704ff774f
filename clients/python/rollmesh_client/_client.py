"""`Client`: one object for the whole mesh, one channel per service, created on first use."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Generic
from typing import TypeVar
from typing import overload

import grpc

from rollmesh_client._base import UNAVAILABLE_RETRY_S
from rollmesh_client._base import ServiceClient
from rollmesh_client._channel import aio_channel
from rollmesh_client._gateway import GatewayClient
from rollmesh_client._registry import RegistryClient
from rollmesh_client._scheduler import SchedulerClient
from rollmesh_client._verifier import VerifierClient

# Each service's default port (DESIGN.md), the one table: the servers' config (mesh/config.py) reads it.
DEFAULT_PORTS = {"registry": 50051, "verifier": 50052, "gateway": 50053, "scheduler": 50054}


def default_address(service: str) -> str:
    return os.environ.get(f"ROLLMESH_{service.upper()}_ADDR") or f"127.0.0.1:{DEFAULT_PORTS[service]}"


C = TypeVar("C", bound=ServiceClient)


class _Service(Generic[C]):
    """`Client.<service>`: that service's client, made on first use over its channel."""

    def __init__(self, cls: type[C]) -> None:
        self.cls = cls

    def __set_name__(self, owner: type[Client], name: str) -> None:
        self.service = name

    @overload
    def __get__(self, client: None, owner: type[Client]) -> _Service[C]: ...
    @overload
    def __get__(self, client: Client, owner: type[Client]) -> C: ...
    def __get__(self, client: Client | None, owner: type[Client]) -> C | _Service[C]:
        if client is None:  # looked up on the class (help(), introspection): the descriptor
            return self
        made = client._clients.get(self.service)
        if not isinstance(made, self.cls):
            made = self.cls(
                client.channel(self.service),
                timeout_s=client.timeout_s,
                retry_unavailable_s=client.retry_unavailable_s,
            )
            client._clients[self.service] = made
        return made


class Client:
    """The async client for the whole mesh.

        async with await Client.connect(api_key=None) as c:
            async for a in c.registry.artifacts("dataset"): ...

    Addresses default to `ROLLMESH_<SERVICE>_ADDR`, then the standard ports.
    `retry_unavailable_s` (set it before the first call; default 15 s, 0 turns it off): how long
    reads, and submits (made idempotent by a request id), retry UNAVAILABLE once the service was
    reached, e.g. while it restarts (see _base.py).
    """

    def __init__(
        self,
        addresses: dict[str, str],
        *,
        api_key: str | None,
        timeout_s: float | None,
        retry_unavailable_s: float = UNAVAILABLE_RETRY_S,
    ) -> None:
        self.addresses = addresses
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.retry_unavailable_s = retry_unavailable_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._clients: dict[str, ServiceClient] = {}

    @classmethod
    async def connect(
        cls,
        *,
        registry: str | None = None,
        verifier: str | None = None,
        gateway: str | None = None,
        scheduler: str | None = None,
        api_key: str | None = None,
        timeout_s: float | None = 60.0,
    ) -> Client:
        given = {"registry": registry, "verifier": verifier, "gateway": gateway, "scheduler": scheduler}
        addrs = {svc: addr or default_address(svc) for svc, addr in given.items()}
        key = api_key if api_key is not None else (os.environ.get("ROLLMESH_API_KEY") or None)
        return cls(addrs, api_key=key, timeout_s=timeout_s)

    def channel(self, service: str) -> grpc.aio.Channel:
        if service not in self._channels:
            self._channels[service] = aio_channel(self.addresses[service], api_key=self.api_key)
        return self._channels[service]

    registry = _Service(RegistryClient)
    gateway = _Service(GatewayClient)
    verifier = _Service(VerifierClient)
    scheduler = _Service(SchedulerClient)

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self._clients.clear()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
