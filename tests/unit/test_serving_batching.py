"""Micro-batching of whole-output requests (serving/batching.py), with a scripted replica: no Ray."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import Sampling
from rollmesh.serving.batching import Batcher
from rollmesh.serving.batching import BatchItem
from rollmesh.serving.batching import BatchReport
from rollmesh.serving.batching import run_batch
from rollmesh.serving.errors import BatchItemFailed
from rollmesh.serving.errors import RequestRejected

pytestmark = pytest.mark.asyncio


class ReplicaDied(Exception):
    pass


def _item(i: int, *, max_tokens: int = 4) -> BatchItem:
    return BatchItem(f"r{i}", [1, 2, i], Sampling(max_tokens=max_tokens, seed=i))


async def _answer(item: BatchItem) -> EngineChunk:
    """A scripted engine: output = the prompt's last id repeated max_tokens times; `reject` ids fail."""
    await asyncio.sleep(0.001 * item.prompt_token_ids[-1])
    if item.sampling.max_tokens == 0:
        raise RequestRejected("max_tokens must be at least 1")
    ids = (item.prompt_token_ids[-1],) * item.sampling.max_tokens
    return EngineChunk(token_ids=ids, logprobs=(-0.5,) * len(ids), finish_reason="length", replica_id="A")


class ScriptedReplica:
    """`send` for a Batcher: runs each batch through run_batch; records the calls."""

    def __init__(self, *, die_after_accept: bool = False) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.die_after_accept = die_after_accept

    async def send(self, items: list[BatchItem], avoid: str) -> AsyncIterator[BatchReport]:
        self.calls.append(([i.request_id for i in items], avoid))
        async for report in run_batch("A", items, _answer):
            yield report
            if self.die_after_accept:
                raise ReplicaDied("actor died")


async def test_requests_submitted_together_travel_in_one_call_and_each_gets_its_own_output() -> None:
    replica = ScriptedReplica()
    batcher = Batcher(replica.send, linger_s=0.01)
    tickets = [batcher.submit(_item(i)) for i in range(1, 6)]
    outputs = await asyncio.gather(*(t.output for t in tickets))
    assert [r for r, _ in replica.calls] == [["r1", "r2", "r3", "r4", "r5"]]
    assert [o.token_ids for o in outputs] == [(i,) * 4 for i in range(1, 6)]
    assert all(t.replica.result() == "A" for t in tickets)
    assert (batcher.calls_sent, batcher.items_sent) == (1, 5)
    await batcher.aclose()


async def test_max_batch_splits_and_retries_keep_their_avoided_replica() -> None:
    replica = ScriptedReplica()
    batcher = Batcher(replica.send, max_batch=2, linger_s=0.01)
    tickets = [batcher.submit(_item(i)) for i in range(1, 4)]
    retry = batcher.submit(_item(9), avoid_replica="B")
    await asyncio.gather(*(t.output for t in [*tickets, retry]))
    assert sorted(replica.calls) == [(["r1", "r2"], ""), (["r3"], ""), (["r9"], "B")]
    await batcher.aclose()


async def test_a_rejected_request_fails_alone() -> None:
    replica = ScriptedReplica()
    batcher = Batcher(replica.send, linger_s=0.01)
    good = batcher.submit(_item(1))
    bad = batcher.submit(_item(2, max_tokens=0))
    assert (await good.output).token_ids == (1, 1, 1, 1)
    with pytest.raises(RequestRejected, match="max_tokens"):
        await bad.output
    assert await bad.replica == "A"  # it reached the replica, which refused it
    await batcher.aclose()


async def test_cancel_before_the_batch_leaves_drops_the_request() -> None:
    replica = ScriptedReplica()
    batcher = Batcher(replica.send, linger_s=0.05)
    kept = batcher.submit(_item(1))
    dropped = batcher.submit(_item(2))
    assert batcher.cancel(dropped) is True
    assert (await dropped.output).finish_reason == "abort"
    await kept.output
    assert [r for r, _ in replica.calls] == [["r1"]]
    assert batcher.cancel(kept) is False  # a replica had it: the caller aborts it there
    await batcher.aclose()


async def test_a_replica_failure_fails_every_waiting_request_of_the_batch_with_its_error() -> None:
    replica = ScriptedReplica(die_after_accept=True)
    batcher = Batcher(replica.send, linger_s=0.01)
    tickets = [batcher.submit(_item(i)) for i in range(1, 4)]
    for t in tickets:
        assert await t.replica == "A"
        with pytest.raises(ReplicaDied):
            await t.output
    await batcher.aclose()


async def test_aclose_fails_what_waits() -> None:
    started = asyncio.Event()

    async def hang(items: list[BatchItem], avoid: str) -> AsyncIterator[BatchReport]:
        started.set()
        await asyncio.Event().wait()
        yield BatchReport("never")

    batcher = Batcher(hang, linger_s=0.0)
    ticket = batcher.submit(_item(1))
    await asyncio.wait_for(started.wait(), 10)
    await batcher.aclose()
    with pytest.raises(BatchItemFailed):
        await ticket.output


async def test_run_batch_names_the_replica_first_then_reports_items_as_they_finish() -> None:
    items = [_item(30), _item(1), _item(2, max_tokens=0)]
    reports = [r async for r in run_batch("A", items, _answer)]
    assert reports[0] == BatchReport("A")
    done = {rid: c for r in reports[1:] for rid, c in r.done.items()}
    rejected = {rid: m for r in reports[1:] for rid, m in r.rejected.items()}
    assert set(done) == {"r30", "r1"} and set(rejected) == {"r2"}
    order = [rid for r in reports[1:] for rid in (*r.done, *r.rejected)]
    assert order.index("r1") < order.index("r30")  # the quick one was not held back


async def test_cancelling_run_batch_cancels_every_running_item() -> None:
    cancelled: list[str] = []

    async def slow(item: BatchItem) -> EngineChunk:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(item.request_id)
            raise
        raise AssertionError("unreachable")

    batch = run_batch("A", [_item(1), _item(2)], slow)
    assert (await anext(batch)).replica_id == "A"
    waiting = asyncio.ensure_future(anext(batch))
    await asyncio.sleep(0.05)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await batch.aclose()
    assert sorted(cancelled) == ["r1", "r2"]
