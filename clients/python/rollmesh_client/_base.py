"""The base every per-service client shares: one channel, a default deadline, typed errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from rollmesh_client._errors import from_grpc_error

R = TypeVar("R")


async def unary_call(method: Callable[..., Awaitable[R]], request: Any, timeout_s: float | None) -> R:
    """One unary RPC with a deadline; a failure raises the SDK's typed error for its code."""
    try:
        return await method(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        raise from_grpc_error(exc) from None


class ServiceClient:
    """Wraps one generated stub. `.stub` is the raw escape hatch."""

    stub_class: Any = None

    def __init__(self, channel: grpc.aio.Channel, *, timeout_s: float | None = 60.0) -> None:
        self.channel = channel
        self.timeout_s = timeout_s
        self.stub = self.stub_class(channel)

    async def _unary(
        self, method: Callable[..., Awaitable[R]], request: Any, *, timeout_s: float | None = None
    ) -> R:
        return await unary_call(method, request, timeout_s or self.timeout_s)

    async def _stream(
        self, method: Callable[..., Any], request: Any, *, timeout_s: float | None = None
    ) -> AsyncIterator[Any]:
        """The responses of a server- or bidi-streaming call (`request`: a message or an iterator
        of them); a failure raises the SDK's typed error, and leaving early cancels the call."""
        call = method(request, timeout=timeout_s)
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as exc:
            raise from_grpc_error(exc) from None
        finally:
            call.cancel()

    async def _pages(
        self, method: Callable[..., Awaitable[Any]], make_request: Callable[[str], Any], field: str
    ) -> AsyncIterator[Any]:
        """Every item of a paginated List RPC: `make_request(page_token)` builds each page's request
        and `field` names the repeated field of the response; page tokens stay hidden."""
        token = ""
        while True:
            resp = await self._unary(method, make_request(token))
            for item in getattr(resp, field):
                yield item
            token = resp.next_page_token
            if not token:
                return
