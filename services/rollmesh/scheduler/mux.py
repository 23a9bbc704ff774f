"""Many calls over one bidirectional stream, client side (the scheduler's Verify and Generate calls).

At a thousand rollouts a second a unary RPC per model turn and per verification is most of the
scheduler's CPU; a message on an open stream costs both ends a fraction of that. `Multiplexed`
opens the stream on first use, gives each call an id and a future, and a reader task resolves the
futures as answers (or per-item errors, typed by `from_status`) come back in completion order.

- A call that outlives its deadline raises DEADLINE_EXCEEDED; a call whose caller is cancelled
  sends a cancel item when the RPC has one (GenerateMany: the gateway aborts the engine request).
- When the stream breaks (the peer restarted, the network dropped), every waiting call fails with
  UNAVAILABLE (the retry policy retries it) and the next call opens a new stream. A stream-level
  INTERNAL/UNKNOWN/CANCELLED is a broken transport too (grpc reports "Internal error from Core"
  when the peer ends the call while a message is being written): application errors come per item.
- Before its first stream, a `Multiplexed` asks the peer whether it has the method at all: an
  empty stream, half-closed at once, ends OK or UNIMPLEMENTED. (Learning it from the first real
  stream is racy: a rejection that crosses a write surfaces as that INTERNAL.) Calls to a peer
  without it raise UNIMPLEMENTED, which callers answer with their unary RPC.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

import grpc

from rollmesh.mesh.aio import TaskSet
from rollmesh_client import DeadlineExceededError, RollmeshClientError, UnavailableError, from_grpc_error

_PROBE_TIMEOUT_S = 30.0
_BROKEN_TRANSPORT = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Out = TypeVar("Out")

#: (id, payload, deadline in seconds) -> the stream's request message.
MakeItem = Callable[[str, Any, float], Req]
#: A stream's response message -> (id, answer or its typed error).
ReadAnswer = Callable[[Resp], tuple[str, Out | RollmeshClientError]]


class Multiplexed(Generic[Req, Resp, Out]):
    def __init__(
        self,
        open_call: Callable[..., Any],
        *,
        make_item: MakeItem[Req],
        read_answer: ReadAnswer[Resp, Out],
        make_cancel: Callable[[str], Req] | None = None,
        what: str,
    ) -> None:
        """`open_call(requests, timeout=None)` starts the stream-stream RPC (e.g. `stub.VerifyBatch`)."""
        self._open_call = open_call
        self._make_item = make_item
        self._read_answer = read_answer
        self._make_cancel = make_cancel
        self._what = what
        self._ids = itertools.count()
        self._pending: dict[str, asyncio.Future[Out]] = {}
        self._outbox: asyncio.Queue[Req | None] | None = None
        self._tasks = TaskSet()
        self._probe: asyncio.Future[None] | None = None
        self._unimplemented: RollmeshClientError | None = None

    async def call(self, payload: Any, deadline_s: float) -> Out:
        if self._unimplemented is not None:
            raise self._unimplemented
        if self._outbox is None and self._probe is None:
            self._probe = asyncio.ensure_future(self._ask_peer())
        if self._probe is not None and not self._probe.done():
            await asyncio.shield(self._probe)
        if self._unimplemented is not None:
            raise self._unimplemented
        outbox = self._outbox if self._outbox is not None else self._open()
        item_id = str(next(self._ids))
        fut: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._pending[item_id] = fut
        outbox.put_nowait(self._make_item(item_id, payload, deadline_s))
        try:
            async with asyncio.timeout(deadline_s):
                return await fut
        except TimeoutError:
            self._cancel(outbox, item_id)
            raise DeadlineExceededError(
                f"{self._what} took longer than {deadline_s:g}s", code=grpc.StatusCode.DEADLINE_EXCEEDED
            ) from None
        except asyncio.CancelledError:
            self._cancel(outbox, item_id)
            raise
        finally:
            self._pending.pop(item_id, None)

    async def _ask_peer(self) -> None:
        """Does the peer serve this stream method? Sets `_unimplemented` when it does not; any other
        outcome (OK, or the peer unreachable for now) lets calls go ahead."""

        async def nothing() -> AsyncIterator[Req]:
            return
            yield  # an async generator that ends at once: the stream is half-closed unwritten

        call = self._open_call(nothing(), timeout=_PROBE_TIMEOUT_S)
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._unimplemented = from_grpc_error(exc)
            else:
                self._probe = None  # unknown yet: ask again before the next stream
        except Exception:
            self._probe = None

    def _cancel(self, outbox: asyncio.Queue[Req | None], item_id: str) -> None:
        fut = self._pending.get(item_id)
        # Our own wait cancels the future too (deadline, caller cancelled): only an answer counts.
        answered = fut is not None and fut.done() and not fut.cancelled()
        if self._make_cancel is not None and not answered and self._outbox is outbox:
            outbox.put_nowait(self._make_cancel(item_id))

    def _open(self) -> asyncio.Queue[Req | None]:
        outbox: asyncio.Queue[Req | None] = asyncio.Queue()
        self._outbox = outbox
        self._tasks.spawn(self._run(outbox), name=f"{self._what}-stream")
        return outbox

    async def _run(self, outbox: asyncio.Queue[Req | None]) -> None:
        async def requests() -> AsyncIterator[Req]:
            while (item := await outbox.get()) is not None:
                yield item

        call = self._open_call(requests())
        error: Exception = UnavailableError(
            f"the peer ended the {self._what} stream", code=grpc.StatusCode.UNAVAILABLE
        )
        try:
            async for resp in call:
                item_id, answer = self._read_answer(resp)
                fut = self._pending.get(item_id)
                if fut is None or fut.done():
                    continue  # its caller gave up (deadline, cancel)
                if isinstance(answer, RollmeshClientError):
                    fut.set_exception(answer)
                else:
                    fut.set_result(answer)
        except grpc.aio.AioRpcError as exc:
            error = from_grpc_error(exc)
            if exc.code() in _BROKEN_TRANSPORT:
                error = UnavailableError(
                    f"the {self._what} stream broke ({exc.code().name}: {exc.details()})",
                    code=grpc.StatusCode.UNAVAILABLE,
                )
            elif exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._unimplemented = error
        finally:
            if self._outbox is outbox:
                self._outbox = None  # the next call opens a new stream
            call.cancel()
            for fut in list(self._pending.values()):
                if not fut.done():
                    fut.set_exception(error)

    async def close(self) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(None)
            self._outbox = None
        await self._tasks.aclose()
