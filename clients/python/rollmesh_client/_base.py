"""The base every per-service client shares: one channel, a default deadline, typed errors, and
retries where they cannot duplicate work.

A read (Get, List, Resolve, metrics: `idempotent=True`) that fails UNAVAILABLE (the server is
restarting or draining, the channel is between reconnect attempts) is retried with a doubling
backoff (0.05 s to 1 s) for up to `retry_unavailable_s` (default `UNAVAILABLE_RETRY_S`), then
raised; only once the client has reached its server, so a service that is not running at all
fails at once (a CLI command against a stopped mesh says so without waiting). A call that does
work (Generate, Verify, CallTool ...) is never retried here: its caller decides (the scheduler's
retry policy does). A server stream that can resume where it broke
(`StreamRollouts`, by offset) resumes in its client; others raise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import TypeVar

import grpc

from rollmesh_client._errors import from_grpc_error

R = TypeVar("R")

#: Seconds an idempotent call keeps retrying UNAVAILABLE before raising it.
UNAVAILABLE_RETRY_S = 15.0
_FIRST_RETRY_S, _MAX_RETRY_GAP_S = 0.05, 1.0


class UnavailableRetry:
    """Backoff for retrying UNAVAILABLE within a budget: `await retry.wait()` sleeps before the
    next attempt and returns False once the budget is spent."""

    def __init__(self, budget_s: float) -> None:
        self._give_up = time.monotonic() + budget_s
        self._gap = _FIRST_RETRY_S

    async def wait(self) -> bool:
        if time.monotonic() + self._gap > self._give_up:
            return False
        await asyncio.sleep(self._gap)
        self._gap = min(self._gap * 2, _MAX_RETRY_GAP_S)
        return True


async def unary_call(
    method: Callable[..., Awaitable[R]],
    request: Any,
    timeout_s: float | None,
    *,
    retry_unavailable_s: float = 0.0,
    metadata: Sequence[tuple[str, str]] | None = None,
) -> R:
    """One unary RPC with a deadline (and `metadata`, when given); a failure raises the SDK's typed
    error for its code. With `retry_unavailable_s` (only for calls safe to repeat), UNAVAILABLE is
    retried that long."""
    retry = UnavailableRetry(retry_unavailable_s)
    while True:
        try:
            if metadata:
                return await method(request, timeout=timeout_s, metadata=metadata)
            return await method(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or not await retry.wait():
                raise from_grpc_error(exc) from None


class ServiceClient:
    """Wraps one generated stub. `.stub` is the raw escape hatch."""

    stub_class: Any = None

    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        timeout_s: float | None = 60.0,
        retry_unavailable_s: float = UNAVAILABLE_RETRY_S,
    ) -> None:
        self.channel = channel
        self.timeout_s = timeout_s
        self.retry_unavailable_s = retry_unavailable_s
        self.stub = self.stub_class(channel)
        self._reached = False  # has a call of this client been answered?

    def unavailable_budget(self, idempotent: bool = True) -> float:
        """Seconds a call may retry UNAVAILABLE: none unless it is safe to repeat and the server
        has answered this client before (it is restarting, not absent)."""
        return self.retry_unavailable_s if idempotent and self._reached else 0.0

    async def _unary(
        self,
        method: Callable[..., Awaitable[R]],
        request: Any,
        *,
        timeout_s: float | None = None,
        idempotent: bool = False,
    ) -> R:
        """`idempotent`: repeating the call changes nothing, so UNAVAILABLE is retried."""
        retry_s = self.unavailable_budget(idempotent)
        result = await unary_call(method, request, timeout_s or self.timeout_s, retry_unavailable_s=retry_s)
        self._reached = True
        return result

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
            resp = await self._unary(method, make_request(token), idempotent=True)
            for item in getattr(resp, field):
                yield item
            token = resp.next_page_token
            if not token:
                return
