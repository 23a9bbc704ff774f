"""Many calls over one bidirectional stream, server side (VerifyBatch, GenerateMany).

A stream message costs both ends a fraction of a unary RPC (no new HTTP/2 stream, no metadata, no
per-call interceptors), which is what a caller running a thousand rollouts a second needs. Items
carry the caller's id; they run concurrently, at most `limit` at once, and results come back in
completion order with that id. A per-item failure is that item's result (the stream goes on).
`ItemMessages` keeps it so for answers too: one larger than the message limit would break the write
and so the whole stream; it becomes that item's RESOURCE_EXHAUSTED (reason MESSAGE_TOO_LARGE).

`MultiplexedMethod` is one such RPC (its item, answer message and bound); its `serve` is the stream
handler, which the embedded mesh's in-process calls share (in_process.py).

Batches (the SDK's contract, rollmesh_client/_streams.py): `serve` tells the caller in the initial
metadata that this server reads batch messages (and unpacks them); when the caller wants its answers
batched, every result ready at once (`run_multiplexed_batches`, after one turn of the event loop so
that items finishing in the same turn join them) goes as few messages as the limit allows, instead
of one message per item.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import Generic
from typing import TypeVar

from google.protobuf.message import Message

from rollmesh.mesh.errors import Internal
from rollmesh.mesh.errors import ResourceExhausted
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.errors import to_status
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.metrics import record_item
from rollmesh_client import BATCH_METADATA
from rollmesh_client import batch_messages
from rollmesh_client import items_of
from rollmesh_client import max_message_bytes
from rollmesh_client import says_batches

T = TypeVar("T")
M = TypeVar("M", bound=Message)
log = get_logger("rollmesh.mesh.multiplex")


@dataclass(frozen=True)
class Item(Generic[T]):
    """One incoming item: work to start, or (`work` None) a cancellation of the item `id`."""

    id: str
    work: Callable[[], Awaitable[T]] | None = None


class ItemMessages(Generic[T, M]):
    """Each item's outcome as its stream message, a `message_class` with the item's `id` and either
    `<answer_field>=to_pb(result)` or `error=` a google.rpc.Status: for a failure, and for an answer
    over the message limit (ROLLMESH_MAX_MESSAGE_MB, read when the stream starts), which becomes
    RESOURCE_EXHAUSTED with reason MESSAGE_TOO_LARGE and the numbers."""

    def __init__(
        self, what: str, message_class: type[M], answer_field: str, to_pb: Callable[[T], Message]
    ) -> None:
        self.what = what
        self.limit = max_message_bytes()
        self._message_class = message_class
        self._answer_field = answer_field
        self._to_pb = to_pb

    def _error(self, item_id: str, exc: RollmeshError) -> M:
        return self._message_class(id=item_id, error=to_status(exc))

    def sized(self, item_id: str, outcome: T | RollmeshError) -> tuple[M, int]:
        """The message and its ByteSize."""
        if isinstance(outcome, RollmeshError):
            message = self._error(item_id, outcome)
            return message, message.ByteSize()
        message = self._message_class(id=item_id, **{self._answer_field: self._to_pb(outcome)})
        size = message.ByteSize()
        if size <= self.limit:
            return message, size
        too_large = ResourceExhausted(
            f"the {self.what} answer is {size:,} bytes, over the {self.limit:,}-byte gRPC message limit "
            "(set ROLLMESH_MAX_MESSAGE_MB to raise it)",
            reason="MESSAGE_TOO_LARGE",
            metadata={"size": str(size), "limit": str(self.limit)},
        )
        message = self._error(item_id, too_large)
        return message, message.ByteSize()

    def batched(self, outcomes: Sequence[tuple[str, T | RollmeshError]]) -> list[M]:
        """The outcomes as few batch messages as the message limit allows."""
        sized = [self.sized(item_id, outcome) for item_id, outcome in outcomes]
        return batch_messages([m for m, _ in sized], [n for _, n in sized], self.limit)


async def outcome_of(work: Callable[[], Awaitable[T]], what: str, item_id: str) -> T | RollmeshError:
    """One item's outcome: its result, its domain error, or INTERNAL for any other failure (logged
    with the traceback; the caller gets only the exception's type). Counted in the metrics by its
    code (a cancelled item as CANCELLED)."""
    start, code = time.perf_counter(), "CANCELLED"
    try:
        result = await work()
        code = "OK"
        return result
    except RollmeshError as exc:
        code = exc.code.name
        return exc
    except Exception as exc:
        log.error(f"{what}_failed", id=item_id, exc_info=exc)
        code = "INTERNAL"
        return Internal(f"{what} failed: {type(exc).__name__}")
    finally:
        record_item(what, code, start)


async def run_multiplexed_batches(
    items: AsyncIterator[Item[T]], *, limit: int, what: str = "item"
) -> AsyncIterator[list[tuple[str, T | RollmeshError]]]:
    """Run the items' work concurrently (at most `limit`), yielding (id, result or error) in
    completion order, every result ready at once as one list (never empty). A slow reader slows
    intake: the slots of a list's items free when the next list is asked for. A cancelled item
    yields nothing. Only a failing input stream ends the output (re-raised)."""
    slots = asyncio.Semaphore(limit)
    done: asyncio.Queue[tuple[str, T | RollmeshError] | None] = asyncio.Queue()
    running: dict[str, asyncio.Task[None]] = {}
    reader_error: list[BaseException] = []

    async def one(item_id: str, work: Callable[[], Awaitable[T]]) -> None:
        try:
            res = await outcome_of(work, what, item_id)
        except asyncio.CancelledError:
            slots.release()  # cancelled by the caller: no result to take
            raise
        finally:
            if running.get(item_id) is asyncio.current_task():
                del running[item_id]
        done.put_nowait((item_id, res))

    async def read() -> None:
        try:
            async for item in items:
                if item.work is None:
                    task = running.get(item.id)
                    if task is not None:
                        task.cancel()
                    continue
                await slots.acquire()
                running[item.id] = asyncio.create_task(one(item.id, item.work), name=f"{what}-{item.id}")
            while running:
                await asyncio.wait(list(running.values()))
        except Exception as exc:
            reader_error.append(exc)
        finally:
            done.put_nowait(None)

    reader = asyncio.create_task(read(), name=f"{what}-reader")
    try:
        ended = False
        while not ended and (got := await done.get()) is not None:
            await asyncio.sleep(0)  # one loop turn: the items ready to finish now join this batch
            batch = [got]
            while not done.empty():
                more = done.get_nowait()
                if more is None:
                    ended = True
                    break
                batch.append(more)
            yield batch
            for _ in batch:
                slots.release()
        if reader_error:
            raise reader_error[0]
    finally:
        reader.cancel()
        tasks = list(running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)


@dataclass(frozen=True)
class MultiplexedMethod(Generic[T]):
    """The server side of one multiplexed RPC (GenerateMany, VerifyBatch): the work one incoming
    item runs, how its outcome is answered, and how many items one stream runs at once."""

    item: Callable[[Any], Item[T] | None]  # None: a message that carries no item
    messages: ItemMessages[T, Any]
    limit: int

    async def serve(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The RPC's stream handler: each incoming item (batch messages unpacked) run, at most `limit`
        at once, its answer sent as it finishes (see the module docstring for batches)."""
        await context.send_initial_metadata((BATCH_METADATA,))  # this server reads batch messages
        batched = says_batches(context.invocation_metadata())
        items = (
            item
            async for message in requests
            for req in items_of(message)
            if (item := self.item(req)) is not None
        )
        async for outcomes in run_multiplexed_batches(items, limit=self.limit, what=self.messages.what):
            if batched:
                answers = self.messages.batched(outcomes)
            else:
                answers = [self.messages.sized(item_id, outcome)[0] for item_id, outcome in outcomes]
            for answer in answers:
                yield answer
