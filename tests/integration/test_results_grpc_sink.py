"""The scheduler's gRPC sink client <-> the trainer SDK's SinkServer over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from rollmesh.mesh.server import wait_serving
from rollmesh.scheduler import convert
from rollmesh.scheduler.errors import RolloutTooLarge
from rollmesh.scheduler.errors import SinkUnavailable
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.sinks.grpc import GrpcSink
from rollmesh_client import aio_channel
from rollmesh_client.trainer import SinkServer
from rollmesh_client.trainer import TrainerRollout
from rollmesh_client.trainer import collate
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import sink_pb2
from rollmesh_client.v1 import sink_pb2_grpc


def rollout(t: int, i: int, *, version: str = "0", reward: float | None = None, job: str = "job1") -> Rollout:
    ids = [1, 2, 3 + t, 10 + i, 11, 5, 12]
    return Rollout(
        key=RolloutKey(t, i),
        job_id=job,
        task={"task_id": f"t{t}"},
        messages=[{"role": "assistant", "content": str(t + i)}],
        reward=float((t + i) % 2) if reward is None else reward,
        tokens=TokenRecord(
            ids,
            [0, 0, 0, 1, 1, 0, 1],
            [0, 0, 0, -0.5, -0.25, 0, -0.125],  # float32-exact,
            [TurnSpan(0, 3, 5, version, "r0"), TurnSpan(5, 6, 7, version, "r0")],
        ),
        policy_version=version,
        completion_tokens=3,
    )


async def collect(server: SinkServer) -> list[TrainerRollout]:
    return [r async for r in server.rollouts(until_closed=True)]


async def until(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    """Poll `condition` until it holds; fail after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def resent_after_resume(server: SinkServer, drain_timeout_s: float) -> list[tuple[Any, Any]]:
    """The job is resumed: a new run sends (0, 0) again, reward 0.5. (key, reward) of what the
    trainer then gets."""
    again = GrpcSink(server.address, window=4, drain_timeout_s=drain_timeout_s)
    assert await again.open("job1", total=1, spec={}) == set()
    consumer = asyncio.create_task(collect(server))
    await again.write(rollout(0, 0, reward=0.5))
    await again.close(state="succeeded", metrics=None)
    got = await asyncio.wait_for(consumer, timeout=30)
    return [(r.key, r.reward) for r in got]


def local_manager(tmp_path: Path, model: Any = None) -> Any:
    """A JobManager over the built-in environments with the local fakes (model, verifier)."""
    from rollmesh.registry import BUILTIN_ROOT
    from rollmesh.registry import Catalog
    from rollmesh.registry import Root
    from rollmesh.scheduler.manager import JobManager
    from tests.fakes import LocalEnv
    from tests.fakes import LocalModel

    catalog = Catalog([Root(BUILTIN_ROOT, 0, "root")])
    return JobManager(catalog, model=model or LocalModel(), env=LocalEnv(), output_dir=str(tmp_path))


async def job_into(
    server: SinkServer, spec: Any, tmp_path: Path, model: Any = None
) -> tuple[Any, list[TrainerRollout]]:
    """Run `spec` on a JobManager with the local fakes while a trainer collects from `server`:
    (the ended job, what the trainer got)."""
    mgr = local_manager(tmp_path, model)
    try:
        consumer = asyncio.create_task(collect(server))
        rec = await mgr.submit(spec)
        done = await asyncio.wait_for(mgr.wait(rec.job_id), timeout=60)
        got = await asyncio.wait_for(consumer, timeout=30)
    finally:
        await mgr.aclose()
    return done, got


def trainer_dying_in_step(
    server: SinkServer, size: int, step: int
) -> tuple[asyncio.Task[None], list[list[tuple[int, int]]], asyncio.Event]:
    """A trainer looping over `server.batches(size)` that records each batch's keys and, given its
    `step`-th batch, sets the event and never finishes that optimizer step (it dies in it)."""
    batches: list[list[tuple[int, int]]] = []
    stepping = asyncio.Event()

    async def trainer() -> None:
        async for batch in server.batches(size, until_closed=True):
            batches.append([r.key for r in batch])
            if len(batches) == step:
                stepping.set()
                await asyncio.Event().wait()

    return asyncio.create_task(trainer()), batches, stepping


@pytest_asyncio.fixture
async def make_server() -> AsyncIterator[type[SinkServer]]:
    started: list[SinkServer] = []

    class Started(SinkServer):
        async def start(self) -> SinkServer:
            await super().start()
            started.append(self)
            await wait_serving(self.address, timeout_s=30)
            return self

    try:
        yield Started
    finally:
        for s in started:
            await s.stop(grace=0)


async def test_slow_trainer_keeps_unacked_within_window_and_loses_nothing(
    make_server: type[SinkServer],
) -> None:
    window, n = 4, 40
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=window)
    assert await sink.open("job1", total=n, spec={"num_repeats": 4, "environment": "arithmetic"}) == set()
    got: list[TrainerRollout] = []
    in_flight_seen: list[int] = []

    async def trainer() -> None:
        async for r in server.rollouts(until_closed=True):
            got.append(r)
            in_flight_seen.append(sink.in_flight)
            await asyncio.sleep(0.005)  # a training step slower than generation

    consumer = asyncio.create_task(trainer())
    for t in range(10):
        for i in range(4):
            await sink.write(rollout(t, i))
            assert sink.in_flight <= window
    await sink.close(state="succeeded", metrics=lambda: {"num_rollouts": n, "pass_at_k": {"1": 0.5}})
    await asyncio.wait_for(consumer, timeout=30)

    assert sorted(r.key for r in got) == [(t, i) for t in range(10) for i in range(4)]
    assert sink.max_unacked_seen == window  # the producer did run into the window ...
    assert max(in_flight_seen) <= window and server.stats.max_unacked <= window  # ... and never past it
    assert sink.acked == n and sink.in_flight == 0
    assert server.stats.closed_states == ["JOB_STATE_SUCCEEDED"]
    assert len(server.committed("job1")) == n
    # The record arrived intact.
    r0 = next(r for r in got if r.key == (3, 1))
    assert r0.token_ids == [1, 2, 6, 11, 11, 5, 12] and r0.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert r0.prompt_length == 3 and r0.task == {"task_id": "t3"} and r0.version == 0
    assert convert.rollout_from_pb(r0.raw) == rollout(3, 1)

    # A resumed job learns what the trainer already consumed.
    again = GrpcSink(server.address, window=window)
    assert await again.open("job1", total=0, spec={}) == {
        RolloutKey(t, i) for t in range(10) for i in range(4)
    }
    await again.close(state="succeeded", metrics=None)


async def test_group_complete_delivery_with_a_window_smaller_than_a_group(
    make_server: type[SinkServer],
) -> None:
    server = await make_server(window=8, group_complete=True).start()
    sink = GrpcSink(server.address, window=3)
    await sink.open("job1", total=20, spec={"num_repeats": 4})
    groups: list[list[TrainerRollout]] = []

    async def trainer() -> None:
        async for unit in server.groups(until_closed=True):
            groups.append(unit)

    consumer = asyncio.create_task(trainer())
    for i in range(4):  # repeat-major: every group completes only in the last round
        for t in range(5):
            if (t, i) == (2, 3):
                await sink.write_failure(RolloutFailure(RolloutKey(2, 3), "job1", "UNAVAILABLE", "down", 3))
            else:
                await sink.write(rollout(t, i))
    await sink.close(state="succeeded", metrics=None)
    await asyncio.wait_for(consumer, timeout=30)

    assert sorted(g[0].task_index for g in groups) == [0, 1, 2, 3, 4]
    for g in groups:
        assert len({r.task_index for r in g}) == 1
        assert sorted(r.rollout_index for r in g) == ([0, 1, 2] if g[0].task_index == 2 else [0, 1, 2, 3])
    assert server.stats.failures == 1
    assert sink.max_unacked_seen <= 3 and len(server.committed("job1")) == 19

    batch = collate([r for g in groups for r in g], pad_id=0)
    adv = batch.advantages()
    for gid in set(batch.group_ids.tolist()):
        assert abs(float(adv[batch.group_ids == gid].sum())) < 1e-5  # GRPO: zero mean per group


async def test_more_incomplete_groups_than_max_held_and_the_window_still_flow(
    make_server: type[SinkServer],
) -> None:
    """Rows of incomplete groups past max_held were left in the window; with more groups in flight
    (a job's concurrency over max_held + window, repeats finishing in any order) the window filled
    with rows waiting for rows the scheduler could no longer send: the job stalled and failed on its
    ack timeout with a trainer waiting. A scheduler that sends SinkEnd still owes them, so they are
    held past max_held: its concurrency bounds them (each incomplete group has a repeat in flight)."""
    server = await make_server(window=1, group_complete=True, group_size=4).start()  # max_held 4
    sink = GrpcSink(server.address, window=2, ack_timeout_s=2)
    await sink.open("job1", total=32, spec={"num_repeats": 4})
    consumer = asyncio.create_task(collect(server))
    for i in range(4):  # repeat-major: every group completes only in the last round
        for t in range(8):
            await sink.write(rollout(t, i))
    await sink.close(state="succeeded", metrics=None)
    got = await asyncio.wait_for(consumer, timeout=30)
    assert sorted(r.key for r in got) == [(t, i) for t in range(8) for i in range(4)]
    assert server.stats.closed_states == ["JOB_STATE_SUCCEEDED"] and sink.max_unacked_seen <= 2


async def test_a_group_size_over_the_jobs_repeats_still_delivers_whole_groups_as_they_complete(
    make_server: type[SinkServer],
) -> None:
    """group_size=8 for a job of 4 repeats: no group could ever complete, so every rollout was held
    until the job's end (all of them in the trainer's memory, none trained on meanwhile). A task has
    no more rollouts than the job's repeats: that bounds its group."""
    server = await make_server(window=8, group_complete=True, group_size=8).start()
    sink = GrpcSink(server.address, window=4)
    await sink.open("job1", total=8, spec={"num_repeats": 4})
    groups = server.groups(until_closed=True)
    for i in range(4):
        await sink.write(rollout(0, i))
    first = await asyncio.wait_for(anext(groups), timeout=30)  # before the end
    assert sorted(r.key for r in first) == [(0, i) for i in range(4)]
    for i in range(4):
        await sink.write(rollout(1, i))
    assert len(await asyncio.wait_for(anext(groups), timeout=30)) == 4
    closing = asyncio.create_task(sink.close(state="succeeded", metrics=None))
    assert [u async for u in groups] == []
    await asyncio.wait_for(closing, timeout=30)
    assert server.stats.closed_states == ["JOB_STATE_SUCCEEDED"]


async def test_groups_the_end_releases_reach_a_trainer_busier_than_the_close_waits(
    make_server: type[SinkServer],
) -> None:
    """Held rollouts wait for their group; the end releases partial groups. With the trainer's queue
    full (a long training step) the scheduler stopped waiting for the stream's end and cancelled it,
    losing the groups and the close: the job SUCCEEDED, the trainer never got (1, 0) and (2, 0), and
    its `until_closed` loop never ended. Held is not consumed: the close now waits for them."""
    server = await make_server(window=1, group_complete=True, group_size=2).start()
    sink = GrpcSink(server.address, window=4, rpc_timeout_s=1, drain_timeout_s=30)
    await sink.open("job1", total=6, spec={"num_repeats": 2})
    await sink.write(rollout(0, 0))
    await sink.write_failure(RolloutFailure(RolloutKey(0, 1), "job1", "UNAVAILABLE", "down", 3))
    await sink.write(rollout(1, 0))  # held: its partner never comes
    await sink.write(rollout(2, 0))
    closing = asyncio.create_task(sink.close(state="succeeded", metrics=None))
    await asyncio.wait({closing}, timeout=2 * sink.rpc_timeout_s)  # the trainer is busy meanwhile
    assert not closing.done()  # (1, 0) and (2, 0) are owed
    got = await asyncio.wait_for(collect(server), timeout=30)
    await asyncio.wait_for(closing, timeout=30)
    assert [r.key for r in got] == [(0, 0), (1, 0), (2, 0)]
    assert server.stats.closed_states == ["JOB_STATE_SUCCEEDED"]


async def test_a_trainer_that_dies_before_consuming_a_held_group_leaves_the_job_unfinished(
    make_server: type[SinkServer],
) -> None:
    """Held rollouts were acknowledged on arrival for good: a last group completed by a failure was
    all acknowledged before the trainer had it, the close said SUCCEEDED, and a trainer that died in
    that step lost it. Now a held rollout is acknowledged once its group is consumed."""
    server = await make_server(window=8, group_complete=True, group_size=2).start()
    sink = GrpcSink(server.address, window=4, drain_timeout_s=30)
    await sink.open("job1", total=4, spec={"num_repeats": 2})
    consumer, batches, stepping = trainer_dying_in_step(server, 2, step=2)  # the last step
    for i in range(2):
        await sink.write(rollout(0, i))
    await sink.write(rollout(1, 0))
    await sink.write_failure(RolloutFailure(RolloutKey(1, 1), "job1", "UNAVAILABLE", "down", 3))
    closing = asyncio.create_task(sink.close(state="succeeded", metrics=None))
    await asyncio.wait_for(stepping.wait(), timeout=30)
    assert batches == [[(0, 0), (0, 1)], [(1, 0)]]
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    await server.stop(grace=0)
    with pytest.raises(SinkUnavailable, match="1 rollouts sent were never acknowledged"):
        await asyncio.wait_for(closing, timeout=30)
    assert server.stats.closed_states == []


async def test_stale_rollouts_are_dropped_and_not_committed(make_server: type[SinkServer]) -> None:
    server = await make_server(window=4, max_staleness=1, policy_version=5).start()
    sink = GrpcSink(server.address, window=2)
    await sink.open("job1", total=6, spec={})
    got: list[TrainerRollout] = []

    async def trainer() -> None:
        async for batch in server.batches(2, until_closed=True):
            got.extend(batch)

    consumer = asyncio.create_task(trainer())
    versions = ["3", "4", "5", "2", "", "5"]  # "" has no integer label: never stale
    for i, v in enumerate(versions):
        await sink.write(rollout(0, i, version=v))
    await sink.close(state="succeeded", metrics=None)
    await asyncio.wait_for(consumer, timeout=30)

    assert [r.rollout_index for r in got] == [1, 2, 4, 5]
    assert [r.staleness for r in got] == [1, 0, None, 0]
    assert server.stats.dropped_stale == 2 and sink.in_flight == 0  # dropped ones were acked
    assert server.committed("job1") == {(0, 1), (0, 2), (0, 4), (0, 5)}  # a resume regenerates 0 and 3


def test_a_negative_staleness_bound_is_refused() -> None:
    """max_staleness=-1 (read as "no bound") made every rollout stale: all dropped, none delivered."""
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        SinkServer(max_staleness=-1)
    assert SinkServer(max_staleness=0).max_staleness == 0  # strictly on-policy stays allowed


async def test_flagging_instead_of_dropping(make_server: type[SinkServer]) -> None:
    server = await make_server(max_staleness=0, on_stale="flag", policy_version=2).start()
    sink = GrpcSink(server.address, window=2)
    await sink.open("job1", total=2, spec={})
    consumer = asyncio.create_task(collect(server))
    await sink.write(rollout(0, 0, version="1"))
    await sink.write(rollout(0, 1, version="2"))
    await sink.close(state="cancelled", metrics=None)  # at once: both were sent before it
    got = await asyncio.wait_for(consumer, timeout=30)
    assert [(r.rollout_index, r.stale) for r in got] == [(0, True), (1, False)]
    assert server.stats.closed_states == ["JOB_STATE_CANCELLED"]


async def test_duplicates_are_acked_not_redelivered(make_server: type[SinkServer]) -> None:
    server = await make_server(committed={"job1": [(0, 0)]}).start()
    sink = GrpcSink(server.address, window=2)
    assert await sink.open("job1", total=1, spec={}) == {RolloutKey(0, 0)}
    consumer = asyncio.create_task(collect(server))
    await sink.write(rollout(0, 0))  # a scheduler that resends a committed key: acked, not delivered
    await sink.write(rollout(0, 1))
    await sink.close(state="succeeded", metrics=None)
    got = await asyncio.wait_for(consumer, timeout=30)
    assert [r.key for r in got] == [(0, 1)] and server.stats.duplicates == 1


@pytest.mark.parametrize("group_complete", [False, True])
async def test_a_job_resumed_while_the_trainer_holds_its_rollouts_delivers_each_key_once(
    make_server: type[SinkServer], group_complete: bool
) -> None:
    """The scheduler dies with rollouts queued on the trainer, not yet consumed: ListCommitted lacks
    them, so the resumed run sends them again. Each key reached the trainer twice (GRPO groups twice
    their size); now only the first copy to come out of the queue is. (0, 1) waits on a full queue
    when the first run dies: a key marked held before it was queued was never delivered at all."""
    server = await make_server(window=1, group_complete=group_complete, group_size=2).start()
    channel = aio_channel(server.address)
    first = GrpcSink(server.address, window=4, channel=channel)
    await first.open("job1", total=4, spec={"num_repeats": 2})
    await first.write(rollout(0, 0))
    await first.write(rollout(0, 1))
    await until(lambda: server.stats.received >= 2)  # both reached the trainer
    await channel.close()  # the scheduler's process dies
    again = GrpcSink(server.address, window=4, drain_timeout_s=10)
    assert await again.open("job1", total=4, spec={"num_repeats": 2}) == set()
    for t, i in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        await again.write(rollout(t, i, reward=0.5))
    consumer = asyncio.create_task(collect(server))
    await again.close(state="succeeded", metrics=None)  # raises if a copy were never acknowledged
    got = await asyncio.wait_for(consumer, timeout=30)
    assert sorted(r.key for r in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert next(r.reward for r in got if r.key == (0, 0)) == 0.0  # the copy the trainer had first
    assert server.stats.duplicates >= 1 and len(server.committed("job1")) == 4


async def test_a_copy_resent_while_its_key_waits_in_a_batch_is_acknowledged_once_that_is_consumed(
    make_server: type[SinkServer],
) -> None:
    """A resumed job resends a key the run before left in the trainer's batch, not consumed yet: the
    copy was acknowledged at once as a duplicate, so the resumed job ended SUCCEEDED while the trainer
    still had that batch to train, and a trainer dying in that step lost the row. Now the copy is
    acknowledged when the key is consumed."""
    server = await make_server(window=8).start()
    channel = aio_channel(server.address)
    first = GrpcSink(server.address, window=4, channel=channel)
    await first.open("job1", total=1, spec={})
    consumer, _, stepping = trainer_dying_in_step(server, 4, step=1)
    await first.write(rollout(0, 0))
    await until(lambda: server.stats.delivered >= 1)  # (0, 0) waits in the trainer's partial batch
    await channel.close()  # the scheduler's process dies; the job is resumed
    again = GrpcSink(server.address, window=4, drain_timeout_s=30)
    assert await again.open("job1", total=1, spec={}) == set()
    await again.write(rollout(0, 0))
    closing = asyncio.create_task(again.close(state="succeeded", metrics=None))
    await asyncio.wait_for(stepping.wait(), timeout=30)  # SinkEnd sent the batch out
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    await server.stop(grace=0)
    with pytest.raises(SinkUnavailable, match="1 rollouts sent were never acknowledged"):
        await asyncio.wait_for(closing, timeout=30)
    assert server.stats.closed_states == [] and server.stats.duplicates == 1


async def test_rows_of_a_batch_a_cancelled_loop_was_filling_are_delivered_when_sent_again(
    make_server: type[SinkServer],
) -> None:
    """A loop cancelled while its batch filled (a trainer stopped, a timeout around its wait) kept
    those rows as handed out: the copy a resumed job sends was dropped as one the trainer had, and
    the job ended SUCCEEDED with the row never trained on."""
    server = await make_server(window=8).start()
    channel = aio_channel(server.address)
    first = GrpcSink(server.address, window=4, channel=channel)
    await first.open("job1", total=1, spec={})

    async def trainer() -> None:
        async for _ in server.batches(4):
            pass

    filling = asyncio.create_task(trainer())
    await first.write(rollout(0, 0))
    await until(lambda: server.stats.delivered >= 1)  # (0, 0) is in the batch being filled
    filling.cancel()
    await asyncio.gather(filling, return_exceptions=True)
    await channel.close()  # the job fails; it is resumed
    assert await resent_after_resume(server, drain_timeout_s=5) == [((0, 0), 0.5)]


async def test_a_rollout_left_unconsumed_by_a_loop_that_stopped_is_delivered_when_sent_again(
    make_server: type[SinkServer],
) -> None:
    """A loop that breaks leaves its last rollout unacknowledged: not consumed, so the copy a
    resumed job sends must be delivered, not dropped as a key the trainer has had."""
    server = await make_server(window=8).start()
    channel = aio_channel(server.address)
    first = GrpcSink(server.address, window=4, channel=channel)
    await first.open("job1", total=1, spec={})
    await first.write(rollout(0, 0))
    async with contextlib.aclosing(server.rollouts()) as loop:
        async for _ in loop:
            break  # the trainer stops before using it
    await channel.close()  # the job fails; it is resumed
    assert await resent_after_resume(server, drain_timeout_s=10) == [((0, 0), 0.5)]


async def test_a_trainer_that_dies_in_its_last_step_leaves_the_job_unfinished_and_resume_resends_it(
    make_server: type[SinkServer],
) -> None:
    """batches() acknowledged each unit as it joined a batch, so the scheduler had every ack before
    the last (partial) batch even reached the trainer: it sent SinkClose SUCCEEDED, and a trainer
    that died in that last step lost those rows with the job a success. Now a batch is acknowledged
    once the loop asks for the next: the job does not succeed, and a resume sends the batch again."""
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=8, drain_timeout_s=30)
    await sink.open("job1", total=6, spec={})
    consumer, batches, stepping = trainer_dying_in_step(server, 4, step=2)  # the last step
    for i in range(6):
        await sink.write(rollout(0, i))
    closing = asyncio.create_task(sink.close(state="succeeded", metrics=None))
    await asyncio.wait_for(stepping.wait(), timeout=30)  # SinkEnd sent the partial batch out
    assert batches == [[(0, 0), (0, 1), (0, 2), (0, 3)], [(0, 4), (0, 5)]]
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    saved = server.committed("job1")  # what the trainer's checkpoint holds
    await server.stop(grace=0)  # its process dies
    with pytest.raises(SinkUnavailable, match="2 rollouts sent were never acknowledged"):
        await asyncio.wait_for(closing, timeout=30)
    assert server.stats.closed_states == []  # no SinkClose SUCCEEDED reached the trainer
    assert saved == {(0, 0), (0, 1), (0, 2), (0, 3)}

    restarted = await make_server(window=8, committed={"job1": saved}).start()
    again = GrpcSink(restarted.address, window=8, drain_timeout_s=30)
    assert await again.open("job1", total=6, spec={}) == {RolloutKey(0, i) for i in range(4)}
    consumer = asyncio.create_task(collect(restarted))
    for i in (4, 5):
        await again.write(rollout(0, i))
    await again.close(state="succeeded", metrics=None)
    assert [r.key for r in await asyncio.wait_for(consumer, timeout=30)] == [(0, 4), (0, 5)]
    assert restarted.stats.closed_states == ["JOB_STATE_SUCCEEDED"]


async def test_a_scheduler_that_sends_no_sink_end_still_gets_the_last_partial_batch(
    make_server: type[SinkServer],
) -> None:
    """An older scheduler (no SinkOpen.sends_end) sends no SinkEnd and waits for every ack before
    its close: units are then acknowledged as they join a batch, as before, or the job stalls."""
    server = await make_server(window=8).start()
    async with aio_channel(server.address) as channel:
        call = sink_pb2_grpc.RolloutSinkStub(channel).Consume()
        await call.write(sink_pb2.ConsumeRequest(open=sink_pb2.SinkOpen(job_id="job1", total=3, window=8)))
        got: list[list[tuple[int, int]]] = []

        async def trainer() -> None:
            async for batch in server.batches(4, until_closed=True):
                got.append([r.key for r in batch])

        consumer = asyncio.create_task(trainer())
        for i in range(3):
            await call.write(sink_pb2.ConsumeRequest(rollout=convert.rollout_to_pb(rollout(0, i))))
        acked: set[tuple[int, int]] = set()
        while len(acked) < 3:
            resp = await asyncio.wait_for(call.read(), timeout=30)
            acked |= {(k.task_index, k.rollout_index) for k in resp.acked}
        await call.write(sink_pb2.ConsumeRequest(close=sink_pb2.SinkClose()))
        await call.done_writing()
        await asyncio.wait_for(consumer, timeout=30)
    assert got == [[(0, 0), (0, 1), (0, 2)]]


async def test_a_loop_ends_once_the_server_stopped_with_its_queue_full(make_server: type[SinkServer]) -> None:
    """stop() drops its end-of-stream marker when the queue is full (a trainer busy in a step): the
    loop then took what was queued and waited forever for more."""
    server = await make_server(window=1).start()
    sink = GrpcSink(server.address, window=4)
    await sink.open("job1", total=2, spec={})
    await sink.write(rollout(0, 0))
    await sink.write(rollout(0, 1))  # waits for room in the trainer's queue
    await until(lambda: server.stats.received >= 2)
    await server.stop(grace=0)
    got = await asyncio.wait_for(collect(server), timeout=30)
    assert [r.key for r in got] == [(0, 0)]  # what was queued, then the end
    await sink.close(state="failed", metrics=None)


async def test_stream_must_start_with_open(make_server: type[SinkServer]) -> None:
    server = await make_server().start()
    async with aio_channel(server.address) as channel:
        call = sink_pb2_grpc.RolloutSinkStub(channel).Consume(timeout=10)
        await call.write(sink_pb2.ConsumeRequest(rollout=convert.rollout_to_pb(rollout(0, 0))))
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call:
                pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must be a SinkOpen" in (info.value.details() or "")


async def test_writes_fail_fast_when_the_trainer_goes_away(make_server: type[SinkServer]) -> None:
    server = await make_server().start()
    sink = GrpcSink(server.address, window=1, rpc_timeout_s=5)
    await sink.open("job1", total=3, spec={})
    await sink.write(rollout(0, 0))  # never consumed: the next write waits for credit
    blocked = asyncio.create_task(sink.write(rollout(0, 1)))
    await server.stop(grace=0)
    with pytest.raises(SinkUnavailable) as info:
        await asyncio.wait_for(blocked, timeout=10)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.reason == "SINK_UNAVAILABLE"
    await sink.close(state="failed", metrics=None)


async def test_unreachable_trainer_is_unavailable() -> None:
    sink = GrpcSink("127.0.0.1:1", window=1, rpc_timeout_s=1)
    with pytest.raises(SinkUnavailable):
        await sink.open("job1", total=1, spec={})
    await sink.close(state="failed", metrics=None)


async def test_acks_follow_the_stream_not_the_rows_job_id(make_server: type[SinkServer]) -> None:
    # A row stamped with another job id (e.g. a resumed job under a new id) is still acked on the
    # stream it came by, and committed under the SinkOpen's job id.
    server = await make_server().start()
    sink = GrpcSink(server.address, window=2)
    await sink.open("job-b", total=4, spec={})
    consumer = asyncio.create_task(collect(server))
    for i in range(4):
        await asyncio.wait_for(sink.write(rollout(0, i, job="job-a")), timeout=10)
    await sink.close(state="succeeded", metrics=None)
    got = await asyncio.wait_for(consumer, timeout=30)
    assert {r.job_id for r in got} == {"job-b"} and len(server.committed("job-b")) == 4


async def test_callback_consumer(make_server: type[SinkServer]) -> None:
    server = await make_server(window=4).start()
    sink = GrpcSink(server.address, window=4)
    await sink.open("job1", total=6, spec={})
    sizes: list[int] = []

    async def on_batch(batch: list[TrainerRollout]) -> None:
        sizes.append(len(batch))

    consumer = asyncio.create_task(server.consume(on_batch, batch_size=3))
    for i in range(6):
        await sink.write(rollout(0, i))
    await sink.close(state="succeeded", metrics=None)
    assert await asyncio.wait_for(consumer, timeout=30) == 6
    assert sizes == [3, 3] and sink.in_flight == 0


async def test_batches_go_on_after_a_max_wait_s_batch(make_server: type[SinkServer]) -> None:
    """A batch sent early by `max_wait_s` ended `batches()` for good (the timeout cancelled the
    generator it read from): the loop stopped as if the job had closed, the rest never consumed."""
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=8, drain_timeout_s=5)
    await sink.open("job1", total=6, spec={})
    batches: list[list[tuple[int, int]]] = []
    first = asyncio.Event()

    async def trainer() -> None:
        async for batch in server.batches(4, until_closed=True, max_wait_s=0.2):
            batches.append([r.key for r in batch])
            first.set()

    consumer = asyncio.create_task(trainer())
    for i in range(3):
        await sink.write(rollout(0, i))
    await asyncio.wait_for(first.wait(), timeout=30)  # 3 < 4: out after max_wait_s
    for i in range(3, 6):
        await sink.write(rollout(0, i))
    await sink.close(state="succeeded", metrics=None)
    await asyncio.wait_for(consumer, timeout=30)
    assert batches == [[(0, 0), (0, 1), (0, 2)], [(0, 3), (0, 4), (0, 5)]]


async def test_an_idle_sink_stream_outlives_the_schedulers_keepalive_pings(
    make_server: type[SinkServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler's channel pings every KEEPALIVE_TIME_MS while its sink stream is quiet (a
    trainer step); a SinkServer on grpc's server defaults (one ping per 5 min without data) struck
    each ping and cut the stream with GOAWAY too_many_pings after ~4 min. Scaled down: the client
    pings just past the servers' minimum interval, unthrottled, so the old server cut it in ~45 s."""
    from rollmesh_client import _channel

    ping_ms = dict(_channel.SERVER_KEEPALIVE_OPTIONS)["grpc.http2.min_ping_interval_without_data_ms"] + 1_000
    options = [(k, ping_ms if k == "grpc.keepalive_time_ms" else v) for k, v in _channel.CHANNEL_OPTIONS]
    monkeypatch.setattr(_channel, "CHANNEL_OPTIONS", [*options, ("grpc.http2.max_pings_without_data", 0)])
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=4, rpc_timeout_s=30)
    await sink.open("job1", total=2, spec={})
    consumer = asyncio.create_task(collect(server))
    await sink.write(rollout(0, 0))
    await asyncio.sleep(4.5 * ping_ms / 1000)  # four pings on a stream with no data either way
    await sink.write(rollout(0, 1))
    await sink.close(state="succeeded", metrics=None)
    got = await asyncio.wait_for(consumer, timeout=30)
    assert sorted(r.key for r in got) == [(0, 0), (0, 1)]


async def test_a_rollout_over_grpcs_default_4_mib_reaches_the_trainer(make_server: type[SinkServer]) -> None:
    """The SinkServer takes messages up to ROLLMESH_MAX_MESSAGE_MB (64 MiB) as the scheduler sends
    them; on grpc's default receive limit (4 MiB) a long rollout broke the job's sink stream."""
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=4, rpc_timeout_s=30)
    await sink.open("job1", total=1, spec={})
    consumer = asyncio.create_task(collect(server))
    big = rollout(0, 0)
    big.messages = [{"role": "assistant", "content": "7" * (5 * 1024 * 1024)}]
    await sink.write(big)
    await sink.close(state="succeeded", metrics=None)
    (got,) = await asyncio.wait_for(consumer, timeout=60)
    assert got.key == (0, 0) and len(got.raw.messages[-1].content) == 5 * 1024 * 1024


async def test_a_rollout_over_the_message_limit_is_named(
    make_server: type[SinkServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It broke the stream with "INTERNAL: Internal error from Core", which named nothing. It is
    that rollout's error, never sent: the stream goes on."""
    monkeypatch.setenv("ROLLMESH_MAX_MESSAGE_MB", "1")
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=4)
    await sink.open("job1", total=2, spec={})
    consumer = asyncio.create_task(collect(server))
    big = rollout(0, 3)
    big.messages = [{"role": "assistant", "content": "7" * (2 * 1024 * 1024)}]
    with pytest.raises(RolloutTooLarge, match=r"rollout 0:3 is 2\.0 MiB, over the 1 MiB gRPC message limit"):
        await sink.write(big)
    await sink.write(rollout(0, 4))
    await sink.close(state="succeeded", metrics=None)
    assert [r.key for r in await asyncio.wait_for(consumer, timeout=30)] == [(0, 4)]


async def test_a_rollout_over_the_message_limit_fails_alone_and_the_job_goes_on(
    make_server: type[SinkServer], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One rollout over ROLLMESH_MAX_MESSAGE_MB stopped the whole job (FAILED, every other rollout
    cut): now it is that rollout's failure (ROLLOUT_TOO_LARGE, its key, size and the limit), counted
    and sent to the trainer, and the rest of the job is delivered."""
    from rollmesh.scheduler.spec import JobSpec
    from rollmesh.scheduler.spec import SinkConfig
    from tests.fakes import LocalModel
    from tests.fakes import Rows
    from tests.fakes import arithmetic_script

    monkeypatch.setenv("ROLLMESH_MAX_MESSAGE_MB", "1")

    def script(req: Any, turn: int) -> dict[str, Any]:  # task 2's answer is 1.2 MiB long
        return (
            {"content": "7" * 1_250_000}
            if "2 + 3" in req.messages[-1].content
            else arithmetic_script(req, turn)
        )

    server = await make_server(window=64).start()
    path = Rows.arithmetic(5).write(tmp_path / "d.jsonl")
    sink = SinkConfig(kind="grpc", address=server.address, window=4)
    spec = JobSpec(
        dataset=str(path), environment="arithmetic", output_dir=str(tmp_path), sink=sink, allowed_failures=1
    )
    done, got = await job_into(server, spec, tmp_path, LocalModel(script))
    assert done.state == "SUCCEEDED", done.error  # within allowed_failures=1
    assert sorted(r.key for r in got) == [(0, 0), (1, 0), (3, 0), (4, 0)]
    assert (done.progress.succeeded, done.progress.failed) == (4, 1) and server.stats.failures == 1
    (summary,) = done.failure_summary
    assert (summary.error_class, summary.count) == ("ROLLOUT_TOO_LARGE", 1)
    assert re.search(
        r"rollout 2:0 is \d+\.\d MiB, over the 1 MiB gRPC message limit", summary.example_message
    )


async def test_a_trainer_that_reads_nothing_for_a_step_is_backpressure_not_a_broken_stream(
    make_server: type[SinkServer],
) -> None:
    """A trainer in a step with its queue full stops reading the stream; with a job's window over
    its queue, flow control then held the scheduler's write, and past rpc_timeout_s the stream
    counted as broken: the job failed after a training step longer than rpc_timeout_s (30 s)."""
    server = await make_server(window=1).start()
    sink = GrpcSink(server.address, window=64, rpc_timeout_s=1, ack_timeout_s=60)
    await sink.open("job1", total=20, spec={})
    big = [rollout(0, i) for i in range(20)]
    for r in big:
        r.messages = [{"role": "assistant", "content": "x" * 1_000_000}]

    async def trainer() -> list[TrainerRollout]:
        await asyncio.sleep(3)  # a training step: the trainer takes nothing meanwhile
        return await collect(server)

    consumer = asyncio.create_task(trainer())
    for r in big:
        await sink.write(r)
    await sink.close(state="succeeded", metrics=None)
    got = await asyncio.wait_for(consumer, timeout=60)
    assert sorted(r.key for r in got) == [(0, i) for i in range(20)]


async def test_a_trainer_that_stalls_past_the_drain_timeout_fails_the_close(
    make_server: type[SinkServer],
) -> None:
    """Rollouts the trainer never acknowledged are not delivered: close() must not let the job end
    SUCCEEDED (it did, with a warning in the log), and the trainer is told FAILED."""
    server = await make_server(window=4).start()
    sink = GrpcSink(server.address, window=4, rpc_timeout_s=5, drain_timeout_s=0.5)
    await sink.open("job1", total=2, spec={})
    await sink.write(rollout(0, 0))
    await sink.write(rollout(0, 1))  # nobody consumes: neither is acknowledged
    with pytest.raises(SinkUnavailable) as info:
        await sink.close(state="succeeded", metrics=None)
    assert "2 rollouts sent were never acknowledged" in info.value.message, info.value.message
    assert info.value.metadata["unacked"] == "2"
    assert sink.not_stored() == {RolloutKey(0, 0), RolloutKey(0, 1)}  # the job's metrics leave them out


async def test_a_trainer_acknowledging_each_batch_within_ack_timeout_is_drained_past_it(
    make_server: type[SinkServer],
) -> None:
    """With a window of two batches (what docs/training.md advises for overlap), the end finds two
    batches to train, each step under ack_timeout_s but both together over it: the drain was bounded
    as a whole, so a healthy trainer's job failed. Now, like the run, it fails only on a quiet spell."""
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=4, ack_timeout_s=1.5)
    await sink.open("job1", total=4, spec={})
    steps: list[list[tuple[int, int]]] = []

    async def trainer() -> None:
        async for batch in server.batches(2, until_closed=True):
            steps.append([r.key for r in batch])
            await asyncio.sleep(1.0)  # an optimizer step, under ack_timeout_s

    consumer = asyncio.create_task(trainer())
    for i in range(4):
        await sink.write(rollout(0, i))
    await sink.close(state="succeeded", metrics=None)
    await asyncio.wait_for(consumer, timeout=30)
    assert steps == [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]
    assert server.stats.closed_states == ["JOB_STATE_SUCCEEDED"]


async def test_a_trainer_gone_before_acking_fails_the_close(make_server: type[SinkServer]) -> None:
    server = await make_server(window=4).start()
    sink = GrpcSink(server.address, window=4, rpc_timeout_s=5, drain_timeout_s=30)
    await sink.open("job1", total=1, spec={})
    await sink.write(rollout(0, 0))
    await server.stop(grace=0)
    with pytest.raises(SinkUnavailable, match="1 rollouts sent were never acknowledged"):
        await asyncio.wait_for(sink.close(state="succeeded", metrics=None), timeout=60)


async def test_a_trainer_that_stops_acknowledging_shows_as_waiting(
    make_server: type[SinkServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full window with no acknowledgement is not an error (a training step may take long), but the
    job must say what it waits on instead of looking stuck; it clears once the trainer acks again."""
    from rollmesh.scheduler.sinks import grpc as grpc_sink

    monkeypatch.setattr(grpc_sink, "WAIT_SHOWN_AFTER_S", 0.2)
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=2)
    await sink.open("job1", total=4, spec={})
    await sink.write(rollout(0, 0))
    await sink.write(rollout(0, 1))  # the window is full; nobody consumes yet
    assert sink.waiting() == ""  # not for long yet
    blocked = asyncio.create_task(sink.write(rollout(0, 2)))
    deadline = asyncio.get_running_loop().time() + 30
    while not sink.waiting():
        assert asyncio.get_running_loop().time() < deadline, "the stall never showed"
        await asyncio.sleep(0.05)
    assert not blocked.done()
    said = sink.waiting()
    assert said.startswith(f"trainer sink at {server.address} acknowledged nothing for "), said
    assert said.endswith("(2 unacknowledged, the window)"), said

    got: list[TrainerRollout] = []

    async def trainer() -> None:
        async for r in server.rollouts(until_closed=True):
            got.append(r)

    consumer = asyncio.create_task(trainer())
    await asyncio.wait_for(blocked, timeout=30)
    assert sink.waiting() == ""
    await sink.write(rollout(0, 3))
    await sink.close(state="succeeded", metrics=None)
    await asyncio.wait_for(consumer, timeout=30)
    assert sorted(r.key for r in got) == [(0, i) for i in range(4)]


async def test_a_drain_waiting_on_the_trainer_shows_as_waiting(
    make_server: type[SinkServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its last rollout a job waits for the trainer to train what it holds (a step or two);
    with the window not full, nothing said so: the job sat at 100% RUNNING for minutes."""
    from rollmesh.scheduler.sinks import grpc as grpc_sink

    monkeypatch.setattr(grpc_sink, "WAIT_SHOWN_AFTER_S", 0.2)
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=4)
    await sink.open("job1", total=2, spec={})
    await sink.write(rollout(0, 0))
    await sink.write(rollout(0, 1))  # nobody consumes yet
    closing = asyncio.create_task(sink.close(state="succeeded", metrics=None))
    deadline = asyncio.get_running_loop().time() + 30
    while not sink.waiting():
        assert asyncio.get_running_loop().time() < deadline, "the wait never showed"
        await asyncio.sleep(0.05)
    assert sink.waiting().endswith("(2 unacknowledged, the job's last)"), sink.waiting()
    assert not closing.done()
    consumer = asyncio.create_task(collect(server))
    await asyncio.wait_for(closing, timeout=30)
    assert len(await asyncio.wait_for(consumer, timeout=30)) == 2 and sink.waiting() == ""


async def test_a_trainer_that_acknowledges_nothing_past_ack_timeout_fails_the_job_then_resume_completes(
    make_server: type[SinkServer], tmp_path: Path
) -> None:
    """A trainer alive but stuck (keepalive answered, nothing consumed) stalled the job forever: now
    the job fails after GrpcSinkSpec.ack_timeout_s naming the sink, and a resume against a trainer
    that consumes delivers every key exactly once."""
    from rollmesh.scheduler.spec import JobSpec
    from rollmesh.scheduler.spec import SinkConfig
    from tests.fakes import Rows

    server = await make_server(window=64).start()
    path = Rows.arithmetic(10).write(tmp_path / "d.jsonl")
    sink = SinkConfig(kind="grpc", address=server.address, window=2, ack_timeout_s=1.0)
    spec = JobSpec(dataset=str(path), environment="arithmetic", output_dir=str(tmp_path), sink=sink)
    mgr = local_manager(tmp_path)
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        rec = await mgr.submit(spec)
        done = await asyncio.wait_for(mgr.wait(rec.job_id), timeout=60)
        assert done.state == "FAILED", done.error
        assert f"trainer sink at {server.address} acknowledged nothing for 1 s" in done.error, done.error
        assert "ack_timeout_s 1 s" in done.error and "a resume sends them again" in done.error
        assert loop.time() - t0 < 1 + 20  # the timeout, not the 300 s drain on top

        # The trainer wakes: it consumes what the first run left with it (up to that run's SinkClose,
        # which says FAILED), then the resumed run.
        first = await asyncio.wait_for(collect(server), timeout=30)
        assert server.stats.closed_states == ["JOB_STATE_FAILED"]  # the trainer was told
        consumer = asyncio.create_task(collect(server))
        again = await mgr.submit(JobSpec(resume_job_id=rec.job_id, output_dir=str(tmp_path)))
        final = await asyncio.wait_for(mgr.wait(again.job_id), timeout=60)
        assert final.state == "SUCCEEDED", final.error
        got = first + await asyncio.wait_for(consumer, timeout=30)
    finally:
        await mgr.aclose()
    assert sorted(r.key for r in got) == [(t, 0) for t in range(10)]  # each once, none lost


async def test_a_job_whose_trainer_died_counts_as_succeeded_only_what_the_trainer_consumed(
    make_server: type[SinkServer], tmp_path: Path
) -> None:
    """The trainer dies in a step: the job FAILED, but its progress (GetJob, job.json, `jobs
    status`) said every rollout sent had succeeded, the unconsumed ones too (16 / 0 of 16 with 4
    consumed). A rollout counts as succeeded once the trainer acknowledges it; so the counts add up
    across the resume."""
    from rollmesh.scheduler.job_convert import job_to_pb
    from rollmesh.scheduler.spec import JobSpec
    from rollmesh.scheduler.spec import SinkConfig
    from tests.fakes import Rows

    server = await make_server(window=8).start()
    path = Rows.arithmetic(16).write(tmp_path / "d.jsonl")
    sink = SinkConfig(kind="grpc", address=server.address, window=8)
    spec = JobSpec(dataset=str(path), environment="arithmetic", output_dir=str(tmp_path), sink=sink)
    mgr = local_manager(tmp_path)
    stepping = asyncio.Event()

    async def trainer() -> None:
        async for _ in server.batches(4, until_closed=True):
            if len(server.committed(rec.job_id)) == 4:  # the second step, in which the trainer dies
                stepping.set()
                await asyncio.Event().wait()

    try:
        rec = await mgr.submit(spec)
        consumer = asyncio.create_task(trainer())
        await asyncio.wait_for(stepping.wait(), timeout=30)
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        saved = server.committed(rec.job_id)
        await server.stop(grace=0)
        done = await asyncio.wait_for(mgr.wait(rec.job_id), timeout=60)
        assert done.state == "FAILED", done.error
        p = job_to_pb(done, 0.0).progress
        assert (p.done, p.succeeded, p.failed) == (4, 4, 0) and p.mean_reward == 1.0
        stored = json.loads((tmp_path / rec.job_id / "job.json").read_text())["progress"]
        assert (stored["done"], stored["succeeded"]) == (4, 4)

        restarted = await make_server(window=8, committed={rec.job_id: saved}).start()
        resumed = asyncio.create_task(collect(restarted))
        sink = SinkConfig(kind="grpc", address=restarted.address, window=8)
        again = await mgr.submit(
            JobSpec(
                dataset=str(path),
                environment="arithmetic",
                output_dir=str(tmp_path),
                sink=sink,
                resume_job_id=rec.job_id,
            )
        )
        final = await asyncio.wait_for(mgr.wait(again.job_id), timeout=60)
        got = {r.key for r in await asyncio.wait_for(resumed, timeout=30)}
    finally:
        await mgr.aclose()
    assert final.state == "SUCCEEDED", final.error
    assert sorted(saved | got) == [(t, 0) for t in range(16)] and not saved & got  # each key once
    p = job_to_pb(final, 0.0).progress
    assert (p.succeeded, p.skipped_existing, p.total) == (12, 4, 16)


async def test_a_cancel_does_not_wait_for_the_trainer_to_train_what_it_holds(
    make_server: type[SinkServer], tmp_path: Path
) -> None:
    """CancelJob while the trainer steps on a batch waited until it had trained that batch and the
    partial one the end sends out (up to ack_timeout_s of silence each): minutes, past CancelJob's
    deadline. Now the close says CANCELLED at once, and what the trainer has not acknowledged is not
    counted as done."""
    from rollmesh.scheduler.job_convert import job_to_pb
    from rollmesh.scheduler.spec import JobSpec
    from rollmesh.scheduler.spec import SinkConfig
    from tests.fakes import Rows

    server = await make_server(window=8).start()
    path = Rows.arithmetic(40).write(tmp_path / "d.jsonl")
    sink = SinkConfig(kind="grpc", address=server.address, window=4, ack_timeout_s=60)
    spec = JobSpec(dataset=str(path), environment="arithmetic", output_dir=str(tmp_path), sink=sink)
    mgr = local_manager(tmp_path)
    stepping, step_done = asyncio.Event(), asyncio.Event()
    got: list[tuple[int, int]] = []

    async def trainer() -> None:
        async for batch in server.batches(4, until_closed=True):
            got.extend(r.key for r in batch)
            stepping.set()
            await step_done.wait()  # a long optimizer step

    try:
        rec = await mgr.submit(spec)
        consumer = asyncio.create_task(trainer())
        await asyncio.wait_for(stepping.wait(), timeout=30)
        done = await asyncio.wait_for(mgr.cancel(rec.job_id), timeout=20)  # the step goes on
        assert done.state == "CANCELLED", done.error
        p = job_to_pb(done, 0.0).progress
        assert (p.done, p.succeeded) == (0, 0)  # the batch in the trainer's hand is not acknowledged yet
        step_done.set()
        await asyncio.wait_for(consumer, timeout=30)
    finally:
        await mgr.aclose()
    assert server.stats.closed_states == ["JOB_STATE_CANCELLED"]
    assert len(got) == 4 and server.committed(rec.job_id) == set(got)  # a resume skips it


async def test_rollouts_the_trainer_drops_as_stale_are_counted_apart_from_succeeded(
    make_server: type[SinkServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rollout the trainer dropped for max_staleness (acknowledged, never consumed nor committed)
    counted as succeeded in the job's progress, its reward in mean_reward: now it is stale_dropped,
    in GetJob's progress, job.json and `rollmesh jobs status`."""
    from rollmesh.commands.jobs import _show
    from rollmesh.scheduler.job_convert import job_to_pb
    from rollmesh.scheduler.spec import JobSpec
    from rollmesh.scheduler.spec import SinkConfig
    from tests.fakes import LocalModel
    from tests.fakes import Rows

    server = await make_server(window=64, max_staleness=1, policy_version=2).start()
    path = Rows.arithmetic(6).write(tmp_path / "d.jsonl")
    sink = SinkConfig(kind="grpc", address=server.address, window=4)
    spec = JobSpec(
        dataset=str(path), environment="arithmetic", output_dir=str(tmp_path), sink=sink, concurrency=1
    )

    class Versions(LocalModel):  # tasks 0 and 1 on policy version 0: stale for the trainer at 2
        async def generate(self, call: Any) -> Any:
            self._gw.policy_version = "0" if int(call.session_id.split("/")[-2]) < 2 else "1"
            return await super().generate(call)

    done, got = await job_into(server, spec, tmp_path, Versions())
    assert done.state == "SUCCEEDED", done.error
    assert sorted(r.key for r in got) == [(t, 0) for t in range(2, 6)]
    job = job_to_pb(done, 0.0)
    p = job.progress
    assert (p.done, p.succeeded, p.stale_dropped, p.failed) == (6, 4, 2, 0)
    _show(job, as_json=False)  # rollmesh jobs status
    assert re.search(
        r"succeeded / failed +│ 4 / 0 .*\n.*dropped as stale by the trainer +│ 2 ", capsys.readouterr().out
    )
    stored = json.loads((tmp_path / done.job_id / "job.json").read_text())["progress"]
    assert (stored["succeeded"], stored["stale_dropped"]) == (4, 2)


async def test_acks_of_keys_never_sent_do_not_hold_off_the_ack_timeout(make_server: type[SinkServer]) -> None:
    """A trainer that acknowledges only keys the scheduler is not waiting on (a consumer with a key
    bug) kept the job waiting forever: any ack reset the ack_timeout_s clock."""
    server = await make_server(window=8).start()
    sink = GrpcSink(server.address, window=1, ack_timeout_s=1.0)
    await sink.open("job1", total=2, spec={})
    await sink.write(rollout(0, 0))  # never consumed

    async def wrong_acks() -> None:
        for n in range(1000):
            server.ack([TrainerRollout.from_pb(convert.rollout_to_pb(rollout(9, n)))])
            await asyncio.sleep(0.1)

    acker = asyncio.create_task(wrong_acks())
    try:
        with pytest.raises(SinkUnavailable, match="acknowledged nothing for"):
            await asyncio.wait_for(sink.write(rollout(0, 1)), timeout=20)
    finally:
        acker.cancel()
        await sink.close(state="failed", metrics=None)


async def test_a_trainer_that_acks_twice_or_keys_never_sent_cannot_miscount_the_job() -> None:
    """A buggy or hostile trainer: every key acknowledged twice and said stale twice, `held` after
    its ack, and `held`, `acked` and `dropped_stale` for keys never sent. Each rollout counts once
    (here as a stale drop), nothing is left owed, and the close is not held up."""
    key = common_pb2.RolloutKey

    class Hostile(sink_pb2_grpc.RolloutSinkServicer):
        async def ListCommitted(self, request: Any, context: Any) -> Any:
            return sink_pb2.ListCommittedResponse()

        async def Consume(self, requests: Any, context: Any) -> AsyncIterator[sink_pb2.ConsumeResponse]:
            async for req in requests:
                if req.WhichOneof("item") == "rollout":
                    k = req.rollout.key
                    yield sink_pb2.ConsumeResponse(
                        held=[key(task_index=99)], dropped_stale=[key(task_index=98)]
                    )
                    yield sink_pb2.ConsumeResponse(acked=[k, k, key(task_index=97)], dropped_stale=[k, k])
                    yield sink_pb2.ConsumeResponse(acked=[k], dropped_stale=[k], held=[k])

    server = grpc.aio.server()
    sink_pb2_grpc.add_RolloutSinkServicer_to_server(Hostile(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        sink = GrpcSink(f"127.0.0.1:{port}", window=2, drain_timeout_s=30)
        unconsumed: list[tuple[float, bool]] = []
        sink.on_unconsumed = lambda reward, stale: unconsumed.append((reward, stale))
        await sink.open("job1", total=3, spec={})
        for i in range(3):
            await sink.write(rollout(0, i, reward=1.0))
        await asyncio.wait_for(sink.close(state="succeeded", metrics=None), timeout=30)
    finally:
        await server.stop(0)
    assert unconsumed == [(1.0, True)] * 3 and sink.acked == 3 and sink.in_flight == 0


async def test_the_trainer_gets_the_rows_the_jsonl_sink_writes_for_the_same_job(
    make_server: type[SinkServer], tmp_path: Path
) -> None:
    """One seeded multi-turn tool-calling job (a real gateway on the fake engine, the real verifier,
    logprobs on) run twice, into rollouts.jsonl and into a trainer: every rollout's token record,
    messages, reward and versions arrive the same (logprobs as the float32 the wire carries)."""
    import numpy as np

    from rollmesh.gateway import Gateway
    from rollmesh.gateway.backends.base import EngineRequest
    from rollmesh.gateway.backends.fake import FakeBackend
    from rollmesh.gateway.servicer import GatewayServicer
    from rollmesh.registry import BUILTIN_ROOT
    from rollmesh.registry import Catalog
    from rollmesh.registry import Root
    from rollmesh.registry import RootsConfig
    from rollmesh.scheduler.manager import JobManager
    from rollmesh.scheduler.remote import GatewayModel
    from rollmesh.scheduler.remote import VerifierEnv
    from rollmesh.scheduler.spec import JobSpec
    from rollmesh.scheduler.spec import SinkConfig
    from rollmesh.verifier import VerifierConfig
    from rollmesh.verifier.service import VerifierService
    from rollmesh.verifier.servicer import VerifierServicer

    def script(prompt: str, request: EngineRequest) -> str:
        if prompt.count("<|assistant|>") == 1:  # first turn: call the tool for the city asked about
            city = prompt.rsplit("weather in ", 1)[1].split("?", 1)[0]
            return f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}</tool_call>'
        return f"The tool says: {prompt.rsplit('<|tool|>', 1)[1].split('<|end|>', 1)[0].strip()}"

    gateway = Gateway([FakeBackend("tiny", script=script)])
    await gateway.start()
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    verifier = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await verifier.start()
    mgr = JobManager(
        Catalog([Root(BUILTIN_ROOT, 0, "root")]),
        model=GatewayModel.in_process(GatewayServicer(gateway)),
        env=VerifierEnv.in_process(VerifierServicer(verifier)),
        output_dir=str(tmp_path),
    )
    dataset = BUILTIN_ROOT / "environments/single_tool_call/data/example.jsonl"
    server = await make_server(window=64).start()

    def spec(sink: SinkConfig) -> JobSpec:
        return JobSpec(
            dataset=str(dataset),
            environment="single_tool_call",
            max_steps=3,
            num_repeats=2,
            starting_seed=7,
            sampling={"temperature": 1.0, "logprobs": True},
            validate_all=True,
            output_dir=str(tmp_path),
            sink=sink,
        )

    try:
        to_file = await mgr.submit(spec(SinkConfig()))
        done = await asyncio.wait_for(mgr.wait(to_file.job_id), timeout=60)
        assert done.state == "SUCCEEDED", done.error
        consumer = asyncio.create_task(collect(server))
        to_trainer = await mgr.submit(spec(SinkConfig(kind="grpc", address=server.address)))
        done = await asyncio.wait_for(mgr.wait(to_trainer.job_id), timeout=60)
        assert done.state == "SUCCEEDED", done.error
        got = await asyncio.wait_for(consumer, timeout=30)
    finally:
        await mgr.aclose()
        await verifier.aclose()
        await gateway.shutdown()
    rows_path = tmp_path / to_file.job_id / "rollouts.jsonl"
    rows = {(r["task_index"], r["rollout_index"]): r for r in map(json.loads, rows_path.open())}
    assert len(rows) == len(got) > 2 and {r.key for r in got} == set(rows)
    for r in got:
        stored, sent = Rollout.from_row(rows[r.key]), convert.rollout_from_pb(r.raw)
        tokens = stored.tokens
        assert len(tokens.turns) == 2 and sum(tokens.loss_mask) == stored.completion_tokens
        assert (r.token_ids, r.loss_mask, r.reward) == (tokens.token_ids, tokens.loss_mask, stored.reward)
        assert np.array_equal(np.asarray(r.logprobs, np.float32), np.asarray(tokens.logprobs, np.float32))
        assert min(tokens.logprobs) < 0  # real logprobs, not zeros
        assert sent.tokens.turns == tokens.turns and r.prompt_length == tokens.turns[0].output_start
        same = ("task", "reward_components", "extracted_answer", "seed", "finish_reason", "policy_version")
        assert [getattr(sent, f) for f in same] == [getattr(stored, f) for f in same]
        # Tool-call ids name the job (call_<job id>_...): the one field that differs between the jobs.
        assert without_call_ids(sent.messages) == without_call_ids(stored.messages)
        # Where its time went reaches the trainer too: one model time per turn, the tool call.
        assert len(r.timing["model_s"]) == 2 and len(r.timing["tool_s"]) == 1
        assert sent.timing is not None and sent.timing.to_json() == r.timing


def without_call_ids(messages: list[dict[str, object]]) -> str:
    import re

    return re.sub(r'"(id|tool_call_id)": "[^"]*"', "", json.dumps(messages, sort_keys=True))


@pytest.mark.parametrize("logprobs", [False, True])
async def test_a_job_without_logprobs_gives_the_trainer_none_not_zeros(
    make_server: type[SinkServer], tmp_path: Path, logprobs: bool
) -> None:
    """A job that did not ask for logprobs sent zeros that `collate` handed a trainer as the old
    policy's logprobs (a PPO/GRPO ratio against 0, without a word): now its rollouts carry none and
    the batch's logprobs are None, or an error naming the flag when required. With them, unchanged."""
    from rollmesh.scheduler.spec import JobSpec
    from rollmesh.scheduler.spec import SinkConfig
    from tests.fakes import Rows

    server = await make_server(window=64).start()
    path = Rows.arithmetic(3).write(tmp_path / "d.jsonl")
    spec = JobSpec(
        dataset=str(path),
        environment="arithmetic",
        num_repeats=2,
        sampling={"logprobs": True} if logprobs else {},
        output_dir=str(tmp_path),
        sink=SinkConfig(kind="grpc", address=server.address, window=8),
    )
    done, got = await job_into(server, spec, tmp_path)
    assert done.state == "SUCCEEDED", done.error
    assert len(got) == 6
    batch = collate(got)
    if logprobs:
        assert all(r.logprobs is not None and min(r.logprobs) == -0.5 for r in got)
        assert batch.logprobs is not None and batch.logprobs[batch.loss_mask == 1].tolist() == [-0.5] * int(
            batch.loss_mask.sum()
        )
        assert collate(got, require_logprobs=True).logprobs is not None
    else:
        assert [r.logprobs for r in got] == [None] * 6 and batch.logprobs is None
        with pytest.raises(
            ValueError, match=r"has no logprobs: .*sampling\.logprobs=true \(rollmesh run --logprobs\)"
        ):
            collate(got, require_logprobs=True)
