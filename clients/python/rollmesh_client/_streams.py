"""Many calls over one bidirectional stream, client side (`GenerateMany`, `VerifyBatch`).

At a thousand rollouts a second a unary RPC per model turn and per verification is most of a
caller's CPU; a message on an open stream costs both ends a fraction of that. `Multiplexed` opens
the stream on first use, gives each call an id and a future, and a reader task resolves the futures
as answers (or per-item errors, typed by `from_status`) come back in completion order.
`call_many` runs an iterable of items through one `Multiplexed` with at most `window` unanswered.

- An item whose message would exceed the message limit (`max_message_bytes()`) fails alone with
  INVALID_ARGUMENT naming its size and the limit; it is never written, so it cannot break the
  stream the other calls share.
- A call that outlives its deadline raises DEADLINE_EXCEEDED (a call with no deadline, `None`, is
  bounded by its caller, e.g. the scheduler's per-attempt deadlines); a call whose caller is cancelled
  sends a cancel item when the RPC has one (GenerateMany: the gateway aborts the engine request).
  Deadlines run on one loop timer per `DEADLINE_TICK_S` with calls due, not one timer per call
  (at a thousand calls a second those timers were a tenth of the caller's CPU): a call may outlive
  its deadline by up to that tick.
- When the stream breaks (the peer restarted, the network dropped), every waiting call fails with
  UNAVAILABLE (retry policies retry it) and the next call opens a new stream. A stream-level
  INTERNAL/UNKNOWN/CANCELLED is a broken transport too (grpc reports "Internal error from Core"
  when the peer ends the call while a message is being written): application errors come per item.
- Batches: a message may carry many items in its `batch` field (the RPC's own message type, its
  other fields then unused). A client asks for batched answers with the call metadata
  `rollmesh-batch: 1` (`BATCH_METADATA`); a server that reads batches says so with the same pair in
  its initial metadata, and only then does the writer coalesce the items waiting in its outbox into
  one message (never over the message limit). Nothing waits to fill a batch but one turn of the event
  loop: the writer lets every task ready when the first item came run before it takes the outbox,
  which doubles the items per message at a thousand calls a second. `items_of` unpacks.
- Before its first stream, a `Multiplexed` asks the peer whether it will take the method at all: an
  empty stream, half-closed at once, ends OK, or with the refusal (UNIMPLEMENTED, UNAUTHENTICATED,
  PERMISSION_DENIED ...) that the first real stream would race against its writes. Calls to a peer
  without the method raise UNIMPLEMENTED (callers answer with their unary RPC); other refusals are
  raised to the waiting calls, and the next call asks again.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterable
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import Generic
from typing import TypeVar

import grpc

from rollmesh_client._channel import MAX_MESSAGE_ENV
from rollmesh_client._channel import max_message_bytes
from rollmesh_client._errors import DeadlineExceededError
from rollmesh_client._errors import InvalidArgumentError
from rollmesh_client._errors import RollmeshClientError
from rollmesh_client._errors import UnavailableError
from rollmesh_client._errors import from_grpc_error

_PROBE_TIMEOUT_S = 30.0
_BROKEN_TRANSPORT = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED}
_NOT_A_REFUSAL = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, *_BROKEN_TRANSPORT}
# Room for the stream's own framing around an item (id, deadline, field tags).
_ITEM_OVERHEAD_BYTES = 1024
# Items one batch message carries at most, and the framing each adds inside it (tag + length).
_BATCH_MAX_ITEMS = 512
_BATCH_ITEM_FRAMING = 8

# Deadlines of waiting calls are rounded up to ticks of this many seconds (see the module doc).
DEADLINE_TICK_S = 0.05

#: The metadata pair both ends of a multiplexed stream send to say they read and write batches.
BATCH_METADATA = ("rollmesh-batch", "1")

Req = TypeVar("Req")
M = TypeVar("M")  # a stream message type with a `batch` field
Resp = TypeVar("Resp")
Out = TypeVar("Out")

#: (id, payload, deadline in seconds or None) -> the stream's request message.
MakeItem = Callable[[str, Any, float | None], Req]
#: A stream's response message -> (id, answer or its typed error).
ReadAnswer = Callable[[Resp], tuple[str, Out | RollmeshClientError]]
# (id, request) pairs, from a list or an async source, in; (id, answer or that item's error) out.
IdPairs = AsyncIterable[tuple[str, Req]] | Iterable[tuple[str, Req]]
Answers = AsyncIterator[tuple[str, Out | RollmeshClientError]]


async def id_pairs(items: IdPairs[Req]) -> AsyncIterator[tuple[str, Req]]:
    """`items` as one async iterator, whichever kind it is."""
    if isinstance(items, AsyncIterable):
        async for pair in items:
            yield pair
    else:
        for pair in items:
            yield pair


def items_of(message: M) -> Sequence[M]:
    """The items a stream message carries: its `batch` when that is set, else the message itself."""
    batch: Sequence[M] = message.batch  # type: ignore[attr-defined]
    return batch if len(batch) else (message,)


def says_batches(metadata: Iterable[tuple[str, Any]] | None) -> bool:
    """Does this metadata (a call's, or a stream's initial metadata) carry `BATCH_METADATA`?"""
    return any((key, value) == BATCH_METADATA for key, value in metadata or ())


def batch_messages(messages: Sequence[M], sizes: Sequence[int], limit: int) -> list[M]:
    """`messages` as few batch messages as the message limit allows (`sizes`: each one's ByteSize);
    one message stays itself. Keeps the order."""
    out: list[M] = []
    group: list[M] = []
    total = 0
    for message, size in zip(messages, sizes, strict=True):
        if group and (total + size + _BATCH_ITEM_FRAMING > limit or len(group) >= _BATCH_MAX_ITEMS):
            out.append(_envelope(group))
            group, total = [], 0
        group.append(message)
        total += size + _BATCH_ITEM_FRAMING
    if group:
        out.append(_envelope(group))
    return out


def _envelope(group: list[M]) -> M:
    if len(group) == 1:
        return group[0]
    kind: Any = type(group[0])
    envelope: M = kind(batch=group)
    return envelope


def max_item_bytes() -> int:
    """The largest request a stream item may carry: the message limit less the item's framing."""
    return max_message_bytes() - _ITEM_OVERHEAD_BYTES


def _really_cancelled() -> bool:
    """Is the current task being cancelled? (Else a CancelledError came from grpc.aio itself: a
    stream call whose request writer failed, e.g. against an unreachable peer, is cancelled locally
    and its reader raises CancelledError instead of the call's status.)"""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def too_large(what: str, size: int, limit: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what} request is {size:,} bytes, over the {limit:,}-byte gRPC message limit "
        f"(set {MAX_MESSAGE_ENV} to raise it)",
        code=grpc.StatusCode.INVALID_ARGUMENT,
        reason="MESSAGE_TOO_LARGE",
        metadata={"size": str(size), "limit": str(limit)},
    )


#: A stream's queue of items to write, each with its ByteSize; None half-closes the stream.
_Outbox = asyncio.Queue[tuple[Req, int] | None]


class _DeadlinePassed(Exception):
    """Set on a waiting call's future when its deadline passes (`_Deadlines`)."""


class _Deadlines:
    """Waiting calls' deadlines, on one loop timer per tick that has calls due."""

    def __init__(self) -> None:
        self._due: dict[int, dict[str, asyncio.Future[Any]]] = {}

    def add(self, item_id: str, future: asyncio.Future[Any], deadline_s: float | None) -> int:
        """Fail `future` with `_DeadlinePassed` once `deadline_s` has passed; returns its tick (-1: no
        deadline)."""
        if deadline_s is None:
            return -1
        loop = asyncio.get_running_loop()
        tick = math.ceil((loop.time() + deadline_s) / DEADLINE_TICK_S)
        due = self._due.get(tick)
        if due is None:
            due = self._due[tick] = {}
            loop.call_at(tick * DEADLINE_TICK_S, self._expire, tick)
        due[item_id] = future
        return tick

    def discard(self, tick: int, item_id: str) -> None:
        due = self._due.get(tick)
        if due is not None:
            due.pop(item_id, None)

    def _expire(self, tick: int) -> None:
        for future in self._due.pop(tick, {}).values():
            if not future.done():
                future.set_exception(_DeadlinePassed())


@dataclass(frozen=True)
class Sent:
    """A call on the stream: its id, the future its answer resolves, the stream's outbox."""

    item_id: str
    future: asyncio.Future[Any]
    outbox: asyncio.Queue[Any]


class Multiplexed(Generic[Req, Resp, Out]):
    """Calls of one stream-stream RPC, multiplexed over one stream (reopened when it breaks)."""

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
        self._limit = max_item_bytes()
        self._batch_limit = max_message_bytes()
        self._ids = itertools.count()
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._deadlines = _Deadlines()
        self._outbox: _Outbox[Req] | None = None
        self._readers: set[asyncio.Task[None]] = set()  # one per stream still being read
        self._probe: asyncio.Future[RollmeshClientError | None] | None = None
        self._unimplemented: RollmeshClientError | None = None

    @property
    def what(self) -> str:
        """The call's name in errors (e.g. "Generate")."""
        return self._what

    def make_item(self, item_id: str, payload: Any, deadline_s: float | None) -> Req:
        """The stream message that carries `payload` as item `item_id`."""
        return self._make_item(item_id, payload, deadline_s)

    def read_answer(self, message: Resp) -> tuple[str, Out | RollmeshClientError]:
        """An answer message as (item id, answer or its typed error)."""
        return self._read_answer(message)

    async def call(self, payload: Any, deadline_s: float | None) -> Out:
        """The answer to `payload`; the peer's per-item error, or a stream-level one, is raised."""
        answer = await self.answer(payload, deadline_s)
        if isinstance(answer, RollmeshClientError):
            raise answer
        return answer

    async def answer(self, payload: Any, deadline_s: float | None) -> Out | RollmeshClientError:
        """As `call`, but the peer's (or the size check's) per-item error is returned, not raised;
        what ends the stream for every call (broken transport, refusal, deadline) is raised."""
        await self.ready()
        sent = self.send(payload, deadline_s)
        return sent if isinstance(sent, RollmeshClientError) else await self.wait(sent, deadline_s)

    async def ready(self) -> None:
        """Return when a call may be sent (the peer was asked once); raise the peer's refusal."""
        await self._check_peer()

    def send(self, payload: Any, deadline_s: float | None) -> Sent | RollmeshClientError:
        """Put one call on the stream now (after `ready()`); wait for it with `wait`. An item over the
        message limit is not sent: its error is returned."""
        item_id = str(next(self._ids))
        item = self._make_item(item_id, payload, deadline_s)
        size = item.ByteSize()  # type: ignore[attr-defined]
        if size > self._limit:
            return too_large(self._what, size, self._limit)
        outbox = self._outbox if self._outbox is not None else self._open()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[item_id] = fut
        outbox.put_nowait((item, size))
        return Sent(item_id, fut, outbox)

    async def wait(self, sent: Sent, deadline_s: float | None) -> Out | RollmeshClientError:
        """The answer to a sent call (see `answer`); on deadline or cancel, the peer is told."""
        tick = self._deadlines.add(sent.item_id, sent.future, deadline_s)
        try:
            answer: Out | RollmeshClientError = await sent.future
            return answer
        except _DeadlinePassed:
            self._tell_peer(sent)
            raise DeadlineExceededError(
                f"{self._what} took longer than {deadline_s:g}s", code=grpc.StatusCode.DEADLINE_EXCEEDED
            ) from None
        except asyncio.CancelledError:
            self._cancel(sent)
            raise
        finally:
            self._deadlines.discard(tick, sent.item_id)
            self._pending.pop(sent.item_id, None)

    def done_writing(self) -> None:
        """Half-close the current stream (answers still come back); the next call opens a new one."""
        if self._outbox is not None:
            self._outbox.put_nowait(None)
            self._outbox = None

    async def _check_peer(self) -> None:
        if self._unimplemented is not None:
            raise self._unimplemented
        if self._outbox is not None:
            return
        if self._probe is None:
            self._probe = asyncio.ensure_future(self._ask_peer())
        probe = self._probe
        refusal = await asyncio.shield(probe)
        if refusal is not None:
            if self._probe is probe:
                self._probe = None  # ask again before the next stream
            raise refusal
        if self._unimplemented is not None:
            raise self._unimplemented

    async def _ask_peer(self) -> RollmeshClientError | None:
        """Will the peer take this stream method? Sets `_unimplemented` when it has none; returns
        any other refusal. Anything else (OK, or the peer unreachable for now) lets calls go ahead."""

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
            elif exc.code() in _NOT_A_REFUSAL:
                self._probe = None  # unknown yet: ask again before the next stream
            else:
                return from_grpc_error(exc)
        except asyncio.CancelledError:
            if _really_cancelled():
                raise
            self._probe = None  # grpc cancelled the call itself: the peer could not be reached
        except Exception:
            self._probe = None
        return None

    def _cancel(self, sent: Sent) -> None:
        fut = self._pending.get(sent.item_id)
        # Our own wait cancels the future too (deadline, caller cancelled): only an answer counts.
        answered = fut is not None and fut.done() and not fut.cancelled()
        if not answered:
            self._tell_peer(sent)

    def _tell_peer(self, sent: Sent) -> None:
        """Send the call's cancel item, when the RPC has one and the call's stream is still open."""
        if self._make_cancel is not None and self._outbox is sent.outbox:
            cancel = self._make_cancel(sent.item_id)
            sent.outbox.put_nowait((cancel, cancel.ByteSize()))  # type: ignore[attr-defined]

    def _open(self) -> _Outbox[Req]:
        outbox: _Outbox[Req] = asyncio.Queue()
        self._outbox = outbox
        reader = asyncio.create_task(self._run(outbox), name=f"{self._what}-stream")
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        return outbox

    async def _run(self, outbox: _Outbox[Req]) -> None:
        batches = False  # the peer said (initial metadata) that it reads batches

        async def requests() -> AsyncIterator[Req]:
            while (first := await outbox.get()) is not None:
                if batches:
                    await asyncio.sleep(0)  # one loop turn: the callers ready now put their items too
                if not batches or outbox.empty():
                    yield first[0]
                    continue
                items, sizes, more = [first[0]], [first[1]], True
                while more and not outbox.empty() and len(items) < _BATCH_MAX_ITEMS:
                    nxt = outbox.get_nowait()
                    if nxt is None:
                        more = False  # half-close once these are written
                    else:
                        items.append(nxt[0])
                        sizes.append(nxt[1])
                for message in batch_messages(items, sizes, self._batch_limit):
                    yield message
                if not more:
                    return

        call = self._open_call(requests(), metadata=(BATCH_METADATA,))
        error: RollmeshClientError = UnavailableError(
            f"the peer ended the {self._what} stream", code=grpc.StatusCode.UNAVAILABLE
        )
        try:
            batches = says_batches(await call.initial_metadata())
            async for resp in call:
                for one in items_of(resp):
                    item_id, answer = self._read_answer(one)
                    fut = self._pending.get(item_id)
                    if fut is not None and not fut.done():  # else its caller gave up (deadline, cancel)
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
        except asyncio.CancelledError:
            if _really_cancelled():
                raise
            error = UnavailableError(
                f"the {self._what} stream broke (the peer could not be reached)",
                code=grpc.StatusCode.UNAVAILABLE,
            )
        finally:
            if self._outbox is outbox:
                self._outbox = None  # the next call opens a new stream
            # End the request generator: grpc.aio's writer task waits in it, and `call.cancel()`
            # does not cancel that task once the call has already ended (the peer died). Left
            # waiting, it is collected while pending ("Task was destroyed but it is pending",
            # "aclose(): asynchronous generator is already running").
            outbox.put_nowait(None)
            call.cancel()
            for fut in list(self._pending.values()):
                if not fut.done():
                    fut.set_exception(error)

    async def close(self) -> None:
        """Half-close the stream and stop reading it (calls still waiting fail)."""
        self.done_writing()
        readers = list(self._readers)
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def call_many(
    mux: Multiplexed[Any, Any, Out],
    items: IdPairs[Any],
    *,
    window: int,
    deadline_s: float | None,
    close: bool = False,
) -> Answers[Out]:
    """(id, payload) items through `mux`, at most `window` unanswered; (id, answer or its per-item
    error) in completion order. The stream is half-closed once the items run out (and `mux` closed
    at the end with `close`). A stream-level failure, or an item unanswered for `deadline_s`, ends
    the iteration with that error (raised)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    slots = asyncio.Semaphore(window)
    done: asyncio.Queue[tuple[str, Out | RollmeshClientError] | BaseException | None] = asyncio.Queue()
    waiting: set[asyncio.Task[None]] = set()

    async def wait(item_id: str, sent: Sent) -> None:
        try:
            done.put_nowait((item_id, await mux.wait(sent, deadline_s)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            done.put_nowait(exc)

    async def one(item_id: str, payload: Any) -> None:
        await slots.acquire()
        await mux.ready()
        sent = mux.send(payload, deadline_s)
        if isinstance(sent, RollmeshClientError):
            done.put_nowait((item_id, sent))
            return
        task = asyncio.create_task(wait(item_id, sent), name=f"call_many-{item_id}")
        waiting.add(task)
        task.add_done_callback(waiting.discard)

    async def feed() -> None:
        try:
            async for item_id, payload in id_pairs(items):
                await one(item_id, payload)
            mux.done_writing()
            while waiting:
                await asyncio.wait(set(waiting))
        except Exception as exc:
            done.put_nowait(exc)
        finally:
            done.put_nowait(None)

    feeder = asyncio.create_task(feed(), name="call_many-feed")
    try:
        while (got := await done.get()) is not None:
            if isinstance(got, BaseException):
                raise got
            yield got
            slots.release()
    finally:
        for task in [feeder, *waiting]:
            task.cancel()
        await asyncio.gather(feeder, *waiting, return_exceptions=True)
        if close:
            await mux.close()
