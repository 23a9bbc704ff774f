"""One service calling another in the same process without the gRPC hop (the embedded mesh).

The caller keeps its gRPC port code (e.g. the scheduler's `GatewayModel`) and is handed, instead of a
channel's stub and multiplexed stream, these two, which run the peer's servicer in this process:

- `InProcessStub`: `stub.Method(request, timeout=..., metadata=...)` calls the servicer's `Method`
  with the same request message (the metadata as its context's) and returns its response message.
  A failure raises what the SDK raises for the status the server interceptor would have sent
  (`interceptors.status_of`): a domain error its own code and details, anything else INTERNAL
  (logged here, as the interceptor logs it); past `timeout`, DEADLINE_EXCEEDED.
- `InProcessMux`: the SDK's `Multiplexed.call(payload, deadline_s)` for one multiplexed method
  (`MultiplexedMethod`, which the servicer's stream handler uses too): the SDK's own stream item,
  the servicer's work for it under the stream's concurrency bound, the outcome as the server's
  answer message (`ItemMessages`, which also applies the message limit) read back by the SDK. So
  items over the message limit, per-item errors and their classes are those of the stream. Its calls
  have no deadline of their own (nor have the ports' stream calls: the job bounds them), and
  cancelling the caller cancels the work at once (the stream sends a cancel item for it).

What is skipped is only the transport: serialization, HTTP/2 frames, the stream's tasks and the
network poller's wake-ups, which cost the embedded mesh about a third of its CPU per rollout.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import Generic
from typing import TypeVar

import grpc

from rollmesh.mesh.interceptors import status_of
from rollmesh.mesh.multiplex import MultiplexedMethod
from rollmesh.mesh.multiplex import outcome_of
from rollmesh_client import DeadlineExceededError
from rollmesh_client import RollmeshClientError
from rollmesh_client import max_item_bytes
from rollmesh_client._errors import from_status
from rollmesh_client._streams import Multiplexed
from rollmesh_client._streams import too_large

T = TypeVar("T")
Out = TypeVar("Out")


class _Context:
    """What servicers read of a gRPC context in a call from this process."""

    def __init__(self, deadline: float | None, metadata: Sequence[tuple[str, str]] | None = None) -> None:
        self._deadline = deadline
        self._metadata = tuple(metadata or ())

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def cancelled(self) -> bool:
        return False


class InProcessStub:
    """A stub for `servicer`'s unary methods, called in this process (see the module docstring)."""

    def __init__(self, servicer: Any) -> None:
        self._servicer = servicer

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        return functools.partial(self._call, getattr(self._servicer, method))

    async def _call(
        self,
        handler: Callable[[Any, Any], Awaitable[Any]],
        request: Any,
        timeout: float | None = None,  # noqa: ASYNC109  # a gRPC stub's keyword
        metadata: Sequence[tuple[str, str]] | None = None,
    ) -> Any:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        scope = asyncio.timeout_at(deadline)
        try:
            async with scope:
                return await handler(request, _Context(deadline, metadata))
        except Exception as exc:
            if isinstance(exc, TimeoutError) and scope.expired():
                raise DeadlineExceededError(
                    "Deadline Exceeded", code=grpc.StatusCode.DEADLINE_EXCEEDED
                ) from None
            raise from_status(status_of(exc)) from None


class InProcessMux(Generic[T, Out]):
    """`sdk.call(payload, None)` with `method` run in this process (see the module docstring). Calls
    have no deadline of their own: the caller bounds them (the scheduler's ports: remote.py)."""

    def __init__(self, sdk: Multiplexed[Any, Any, Out], method: MultiplexedMethod[T]) -> None:
        self._sdk = sdk
        self._method = method
        self._slots = asyncio.Semaphore(method.limit)
        self._ids = itertools.count()
        self._limit = max_item_bytes()

    async def call(self, payload: Any, deadline_s: None) -> Out:
        item_id = str(next(self._ids))
        request = self._sdk.make_item(item_id, payload, deadline_s)
        size = request.ByteSize()
        if size > self._limit:
            raise too_large(self._sdk.what, size, self._limit)

        async def work() -> T:
            item = self._method.item(request)
            assert item is not None and item.work is not None  # a request item, never a cancel
            return await item.work()

        async with self._slots:
            outcome = await outcome_of(work, self._method.messages.what, item_id)
        message, _ = self._method.messages.sized(item_id, outcome)
        _, answer = self._sdk.read_answer(message)
        if isinstance(answer, RollmeshClientError):
            raise answer
        return answer

    async def close(self) -> None:
        """Nothing to close (the SDK's `close` ends its stream)."""
