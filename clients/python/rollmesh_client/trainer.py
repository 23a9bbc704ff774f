"""The trainer side of rollmesh: a `RolloutSink` server a trainer embeds in a few lines.

    async with SinkServer(port=0, window=64, group_complete=True, max_staleness=1) as sink:
        print(sink.address)                    # give this to the job: SinkSpec.grpc.address
        async for batch in sink.batches(32, until_closed=True):
            arrays = collate(batch, pad_id=tok.pad_token_id)
            adv = arrays.advantages()          # GRPO, grouped by task
            train_step(arrays, adv)
            sink.policy_version += 1           # after a weight sync

Or in callback form: `await sink.consume(on_batch, batch_size=32)` (acknowledged when
`on_batch` returns).

Backpressure: a rollout is acknowledged to the scheduler only once the trainer has consumed it,
i.e. when the loop asks for the next item (or on `ack()`); the scheduler never has more than its
window unacknowledged, so a slow trainer slows rollout generation, and nothing queues without
bound. Breaking out of a loop leaves the last item unacknowledged (call `ack()` if you used it).

Group-complete delivery (`group_complete=True`): all repeats of a task arrive together (the group
size is `group_size` (at most the job's `num_repeats` from SinkOpen), else `num_repeats`; repeats
the trainer had already consumed, failed repeats and stale drops shrink a group; on SinkEnd or
SinkClose partial groups are delivered). A group is a task's keys of one generation: rollout indices
g*num_repeats .. g*num_repeats + num_repeats-1, g > 0 only in a job that replaces failed groups with
the same task (JobSpec.replace_groups "same_task", docs/training.md); such a job sends no row of a
failed group, so every group delivered is whole. So that groups filled out of order cannot deadlock
against the window, rollouts waiting in an incomplete group are reported `held` on arrival: out of
the scheduler's window, but still owed an acknowledgement, sent, and committed, only when the whole
group is consumed. The job's concurrency bounds them (each incomplete group has a repeat in flight);
left in the window past a bound, they could fill it with rows waiting for rows it no longer lets
through. (A scheduler that sends no SinkEnd, an older one, gets up to `max_held` acknowledged on
arrival, the rest waiting like any rollout.)

Policy versions: labels are integers as strings ("0", "1", ...), set on the gateway after each
weight sync. A rollout's version is the oldest of its turns (and of the parts of a turn a CONTINUE
weight update split: partial rollouts; `TrainerRollout.token_versions` and `collate`'s
`token_versions` give the version of each generated id). Its staleness is
`sink.policy_version - version`; above `max_staleness` it is dropped (acknowledged as a stale drop,
which the job counts as stale_dropped; not delivered, not committed, so a resumed job regenerates
it) or, with `on_stale="flag"`, delivered with
`stale=True`. A rollout without an integer label is never stale. In a job that replaces groups
(JobSpec.replace_groups) a group-complete unit with any stale rollout is dropped whole: the job
replaces it while it runs.

Auth: with a key (`api_key=`, by default `ROLLMESH_API_KEY` from the environment; "" for none)
every RolloutSink call must carry `authorization: Bearer <key>`, as on the mesh's own servers (the
scheduler sends the mesh's key); health answers anyone.

`ListCommitted` answers from what the trainer consumed in this process, plus `committed=` given
at construction (save `sink.committed(job_id)` with your checkpoint to resume across restarts,
after `sink.ack(batch)` of the batch just trained on: `batches()` commits it when the loop asks for
the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from types import TracebackType
from typing import Literal

import grpc
from grpc_health.v1 import health
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from rollmesh_client._auth import BearerAuthInterceptor
from rollmesh_client._batch import RolloutBatch
from rollmesh_client._batch import collate
from rollmesh_client._batch import grpo_advantages
from rollmesh_client._batch import verl_view
from rollmesh_client._channel import SERVER_KEEPALIVE_OPTIONS
from rollmesh_client._channel import message_limit_options
from rollmesh_client._rollout import Key
from rollmesh_client._rollout import TrainerRollout
from rollmesh_client._rollout import parse_version
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2
from rollmesh_client.v1 import sink_pb2
from rollmesh_client.v1 import sink_pb2_grpc

__all__ = [
    "RolloutBatch",
    "SinkServer",
    "SinkStats",
    "TrainerRollout",
    "collate",
    "grpo_advantages",
    "parse_version",
    "verl_view",
]


@dataclass
class SinkStats:
    received: int = 0
    delivered: int = 0
    acked: int = 0
    duplicates: int = 0
    failures: int = 0
    dropped_stale: int = 0
    dropped_stale_tokens: int = 0  # the generated ids (loss_mask 1) of the rollouts dropped as stale
    flagged_stale: int = 0
    jobs_opened: int = 0
    jobs_closed: int = 0
    max_unacked: int = 0  # most rollouts of one stream received and not yet acknowledged
    closed_states: list[str] = field(default_factory=list)


@dataclass
class _JobClosed:
    job_id: str


@dataclass
class _RunEnded:  # SinkEnd: no more rollouts come; batches() sends out its partial batch
    job_id: str


class _Stopped:
    pass


_Unit = list[TrainerRollout]
_Item = _Unit | _JobClosed | _RunEnded | _Stopped


@dataclass
class _Stream:
    job_id: str = ""
    window: int = 0
    group_size: int = 1
    repeats: int = 0  # the job's num_repeats: a task's keys from g*repeats on are its generation g
    replaces: bool = False  # the job replaces failed and stale groups (JobSpec.replace_groups)
    unacked: set[Key] = field(default_factory=set)
    # The next ConsumeResponse's keys by field: acked (dropped_stale: those of them dropped as stale),
    # held (waiting for their group: out of the window, owed an ack; to a scheduler that sends_end).
    pending: dict[str, list[Key]] = field(
        default_factory=lambda: {"acked": [], "dropped_stale": [], "held": []}
    )
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False
    error: str = ""
    # By (task, generation): a job that replaces failed groups with the same task (replace_groups
    # "same_task") runs generation g of a task as its keys g*repeats .. g*repeats + repeats-1.
    groups: dict[Key, list[TrainerRollout]] = field(default_factory=dict)
    expected: dict[Key, int] = field(default_factory=dict)
    held: set[Key] = field(default_factory=set)
    sends_end: bool = False  # the scheduler sends SinkEnd: a batch's acks can wait for its consumption
    ending: asyncio.Task[None] | None = None

    def group_of(self, key: Key) -> Key:
        return (key[0], key[1] // self.repeats if self.repeats else 0)

    def ack(self, keys: Iterable[Key], *, stale: bool = False, held: bool = False) -> None:
        for k in keys:
            self.pending["held" if held else "acked"].append(k)
            self.unacked.discard(k)
            if stale:
                self.pending["dropped_stale"].append(k)
        self.wake.set()


class SinkServer:
    """A `RolloutSink` gRPC server on `host:port` (port 0 picks one; see `.address`)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        window: int = 64,
        group_complete: bool = False,
        group_size: int | None = None,
        max_staleness: int | None = None,
        on_stale: Literal["drop", "flag"] = "drop",
        policy_version: int = 0,
        committed: Mapping[str, Iterable[Key]] | None = None,
        max_held: int | None = None,
        api_key: str | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if max_staleness is not None and max_staleness < 0:  # every rollout stale: none delivered
            raise ValueError(f"max_staleness must be >= 0 (None: no bound), got {max_staleness}")
        if on_stale not in ("drop", "flag"):
            raise ValueError(f"on_stale must be 'drop' or 'flag', got {on_stale!r}")
        self.host = host
        self.port = port
        self.window = window
        self.group_complete = group_complete
        self.group_size = group_size
        self.max_staleness = max_staleness
        self.on_stale = on_stale
        self.policy_version = policy_version
        self.max_held = max_held if max_held is not None else 4 * window
        self._api_key = api_key if api_key is not None else os.environ.get("ROLLMESH_API_KEY", "")
        self.stats = SinkStats()
        self._committed: dict[str, set[Key]] = {j: set(ks) for j, ks in (committed or {}).items()}
        # Keys delivered and not yet committed: a job resumed meanwhile sends them again (ListCommitted
        # lacks them), and that copy must not be delivered too.
        self._delivered: dict[str, set[Key]] = {}
        self._streams: dict[str, _Stream] = {}
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=window)
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._closing: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> SinkServer:
        interceptors = [BearerAuthInterceptor(self._api_key)] if self._api_key else None
        # The mesh's server keepalive (the scheduler's pings on a quiet stream are welcome, not a
        # GOAWAY too_many_pings) and message limit (ROLLMESH_MAX_MESSAGE_MB, as the scheduler sends).
        options = [*SERVER_KEEPALIVE_OPTIONS, ("grpc.so_reuseport", 0), *message_limit_options()]
        server = grpc.aio.server(options=options, interceptors=interceptors)
        sink_pb2_grpc.add_RolloutSinkServicer_to_server(_Servicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        port = server.add_insecure_port(f"{self.host}:{self.port}")
        if port == 0:
            raise OSError(f"could not bind {self.host}:{self.port}")
        self.port = port
        await server.start()
        for name in ("", "rollmesh.v1.RolloutSink"):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._server, self._stopped = server, False
        return self

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        await self._health.enter_graceful_shutdown()
        await server.stop(grace)
        for task in self._closing:
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        self._stopped = True
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_Stopped())

    async def __aenter__(self) -> SinkServer:
        return await self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # -- consuming ---------------------------------------------------------------------------

    def committed(self, job_id: str) -> set[Key]:
        """Keys of `job_id` the trainer has consumed (what ListCommitted answers)."""
        return set(self._committed.get(job_id, set()))

    def ack(self, rollouts: Iterable[TrainerRollout]) -> None:
        """Mark rollouts consumed: committed, and acknowledged to the scheduler (idempotent)."""
        by_job: dict[str, list[Key]] = {}
        for r in rollouts:
            done = self._committed.setdefault(r.job_id, set())
            if r.key not in done:
                done.add(r.key)
                self.stats.acked += 1
            self._delivered.get(r.job_id, set()).discard(r.key)
            by_job.setdefault(r.job_id, []).append(r.key)
        for job_id, keys in by_job.items():
            st = self._streams.get(job_id)
            if st is not None:
                st.ack(keys)

    async def groups(self, *, until_closed: bool = False) -> AsyncGenerator[list[TrainerRollout], None]:
        """Delivery units: one rollout each, or whole groups with `group_complete`. Each unit is
        acknowledged when the loop asks for the next one. `until_closed` ends after a job's close."""
        while (unit := await self._next_unit(until_closed)) is not None:
            with self._handed(unit):
                yield unit
            self.ack(unit)

    async def _next_unit(self, until_closed: bool, *, flush: bool = False) -> _Unit | None:
        """The next unit to deliver; None once the server stops (or, `until_closed`, a job closes);
        with `flush`, [] when a job's run ended (SinkEnd). Safe to cancel (a timeout): nothing is
        taken from the queue then."""
        # Once stopped, what is queued still comes out; the stop marker may not have fit in a full queue.
        while not (self._stopped and self._queue.empty()) and not isinstance(
            item := await self._queue.get(), _Stopped
        ):
            if isinstance(item, _JobClosed):
                if until_closed:
                    return None
                continue
            if isinstance(item, _RunEnded):
                if flush:
                    return []
                continue
            unit = self._deliverable(item)
            if unit:
                self.stats.delivered += len(unit)
                return unit
        return None

    async def rollouts(self, *, until_closed: bool = False) -> AsyncIterator[TrainerRollout]:
        """One rollout at a time; each is acknowledged when the loop asks for the next."""
        async for unit in self.groups(until_closed=until_closed):
            for r in unit:
                yield r
                self.ack([r])

    async def batches(
        self, size: int, *, until_closed: bool = False, max_wait_s: float | None = None
    ) -> AsyncIterator[list[TrainerRollout]]:
        """Lists of about `size` rollouts (groups are never split, so a batch may hold up to one
        group more). A batch goes out early when `max_wait_s` passes without a new rollout, when
        the job has sent its last rollout (SinkEnd), or when waiting longer would exceed the
        scheduler's window (give the job a window >= size). A batch is acknowledged when the loop
        asks for the next one, so a trainer that dies in its last step leaves the job unfinished
        (not SUCCEEDED) and a resume sends that batch again. (A scheduler that sends no SinkEnd, an
        older one, gets each unit acknowledged as it joins a batch, or its last rows would never
        come.)"""
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        batch: list[TrainerRollout] = []
        with self._handed(batch):  # a loop cancelled while a batch fills never had its rows
            while True:
                try:
                    async with asyncio.timeout(max_wait_s if batch else None):
                        unit = await self._next_unit(until_closed, flush=True)
                except TimeoutError:
                    unit = []  # nothing new for max_wait_s: the batch goes out as it is
                if unit is None:
                    break
                if not unit and not batch:
                    continue
                batch.extend(unit)
                if not unit or len(batch) >= min(size, self._min_window()):
                    out = batch.copy()
                    batch.clear()
                    with self._handed(out):
                        yield out
                    self.ack(out)
                else:
                    self.ack([r for r in unit if not self._sends_end(r.job_id)])
        if batch:
            with self._handed(batch):
                yield batch
            self.ack(batch)

    async def consume(
        self,
        on_batch: Callable[[list[TrainerRollout]], Awaitable[None]],
        *,
        batch_size: int = 1,
        until_closed: bool = True,
        max_wait_s: float | None = None,
    ) -> int:
        """Callback form of `batches`: await `on_batch(batch)` for each batch; a batch is
        acknowledged once the callback returns (an exception leaves it unacknowledged and
        propagates). Returns the number of rollouts consumed."""
        n = 0
        async for batch in self.batches(batch_size, until_closed=until_closed, max_wait_s=max_wait_s):
            await on_batch(batch)
            n += len(batch)
        return n

    def _sends_end(self, job_id: str) -> bool:
        st = self._streams.get(job_id)
        return st is not None and st.sends_end

    def _min_window(self) -> int:
        windows = [s.window for s in self._streams.values() if s.window > 0]
        return min(windows) if windows else self.window

    @contextlib.contextmanager
    def _handed(self, unit: _Unit) -> Iterator[None]:
        """Around the yield of `unit`: a loop that stops there leaves it unconsumed, so a copy sent
        again (a resumed job) is delivered, not dropped as one the trainer has had."""
        try:
            yield
        except BaseException:  # GeneratorExit, or a loop cancelled while a batch fills
            for r in unit:
                self._delivered.get(r.job_id, set()).discard(r.key)
            raise

    def _deliverable(self, unit: _Unit) -> _Unit:
        """What of `unit` reaches the trainer: neither a key it has had (a copy sent again by a
        job resumed meanwhile) nor, with on_stale="drop", a stale rollout. The rest is acknowledged
        (the scheduler moves on; a stale drop is said as one) but not committed; a copy of a key
        handed out and not consumed yet, only once that is (or a trainer dying with it lost it)."""
        kept: _Unit = []
        if self.max_staleness is not None:
            for r in unit:
                r.staleness = None if r.version is None else self.policy_version - r.version
                r.stale = r.staleness is not None and r.staleness > self.max_staleness
        st0 = self._streams.get(unit[0].job_id) if unit else None
        # A job that replaces groups gets a whole group dropped when any of it is stale: it replaces
        # the group, and a part of it delivered would be a partial group besides the fresh one.
        whole = (
            self.group_complete
            and self.on_stale == "drop"
            and st0 is not None
            and st0.replaces
            and any(r.stale for r in unit)
        )
        for r in unit:
            delivered = self._delivered.setdefault(r.job_id, set())
            r.stale = r.stale or whole
            dropped = False
            if r.key in delivered:  # the trainer has it, not consumed yet: acked with it (ack())
                self.stats.duplicates += 1
                continue
            if r.key in self._committed.get(r.job_id, ()):
                self.stats.duplicates += 1
            elif dropped := (r.stale and self.on_stale == "drop"):
                self.stats.dropped_stale += 1
                self.stats.dropped_stale_tokens += sum(r.loss_mask)
            else:
                self.stats.flagged_stale += r.stale
                delivered.add(r.key)
                kept.append(r)
                continue
            st = self._streams.get(r.job_id)
            if st is not None:  # a stale drop is said as such: the job counts it apart from succeeded
                st.ack([r.key], stale=dropped)
        return kept

    # -- the RPC side (called by _Servicer) ---------------------------------------------------

    async def _consume(
        self, requests: AsyncIterator[sink_pb2.ConsumeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[sink_pb2.ConsumeResponse]:
        st = _Stream()
        reader = asyncio.create_task(self._read(requests, st))
        try:
            while True:
                await st.wake.wait()
                st.wake.clear()
                if any(st.pending.values()):
                    out, st.pending = st.pending, {name: [] for name in st.pending}
                    yield sink_pb2.ConsumeResponse(**{name: _keys_pb(keys) for name, keys in out.items()})
                if st.done and not any(st.pending.values()):
                    if st.error:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, st.error)
                    return
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            if self._streams.get(st.job_id) is st:
                del self._streams[st.job_id]

    async def _read(
        self,
        requests: AsyncIterator[sink_pb2.ConsumeRequest],
        st: _Stream,
    ) -> None:
        try:
            first = True
            async for req in requests:
                kind = req.WhichOneof("item")
                if first:
                    if kind != "open":
                        st.error = f"the first ConsumeRequest must be a SinkOpen, got {kind}"
                        return
                    self._on_open(req.open, st)
                    first = False
                elif kind == "rollout":
                    await self._on_rollout(req.rollout, st)
                elif kind == "failure":
                    await self._on_failure(req.failure, st)
                elif kind == "end":  # a task of its own, like the close: the queue may be full
                    st.ending = asyncio.create_task(self._on_end(st))
                    self._closing.add(st.ending)
                    st.ending.add_done_callback(self._closing.discard)
                elif kind == "close":
                    # Queued by a task of its own, so the stream ends now: a trainer in a long step
                    # may take what the close releases (held groups, already acknowledged, and the
                    # close itself) later than the scheduler waits; cancelled with the stream, they
                    # were lost while the job ended SUCCEEDED.
                    task = asyncio.create_task(self._on_close(req.close, st))
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
                    return
        finally:
            st.done = True
            st.wake.set()

    def _on_open(self, msg: sink_pb2.SinkOpen, st: _Stream) -> None:
        st.job_id = msg.job_id
        st.window = int(msg.window)
        st.sends_end = msg.sends_end
        repeats, size = int(msg.spec.num_repeats), self.group_size or int(msg.spec.num_repeats) or 1
        st.group_size = min(size, repeats) if repeats else size  # a larger group never completes
        st.repeats = repeats
        st.replaces = bool(msg.spec.replace_groups)
        self._streams[st.job_id] = st
        self._committed.setdefault(st.job_id, set())
        self.stats.jobs_opened += 1

    async def _on_rollout(self, msg: scheduler_pb2.Rollout, st: _Stream) -> None:
        key: Key = (int(msg.key.task_index), int(msg.key.rollout_index))
        self.stats.received += 1
        if key in self._committed[st.job_id]:
            self.stats.duplicates += 1
            st.ack([key])
            return
        if key in st.unacked or key in st.held:
            self.stats.duplicates += 1
            if key in st.held:
                st.ack([key])
            return
        r = TrainerRollout.from_pb(msg)
        r.job_id = st.job_id  # the stream's job is authoritative for acks and ListCommitted
        if not self.group_complete:
            self._track(st, key)
            await self._queue.put([r])
            return
        task = st.group_of(key)
        group = st.groups.setdefault(task, [])
        group.append(r)
        if task not in st.expected:
            st.expected[task] = max(st.group_size - self._done_of(st, task), 1)
        if len(group) >= st.expected[task]:
            self._track(st, key)
            await self._release(st, task)
        elif st.sends_end or len(st.held) < self.max_held:  # (left in the window, it could fill it)
            st.held.add(key)  # waits for its group: out of the window now so it keeps moving
            st.ack([key], held=st.sends_end)  # an older scheduler knows no `held`: acknowledged
        else:
            self._track(st, key)

    async def _on_failure(self, msg: scheduler_pb2.RolloutFailure, st: _Stream) -> None:
        self.stats.failures += 1
        if not self.group_complete:
            return
        task = st.group_of((int(msg.key.task_index), int(msg.key.rollout_index)))
        if task not in st.expected:
            st.expected[task] = max(st.group_size - self._done_of(st, task), 1)
        st.expected[task] -= 1
        if st.groups.get(task) and len(st.groups[task]) >= st.expected[task]:
            await self._release(st, task)
        elif st.expected[task] <= 0 and not st.groups.get(task):  # every repeat failed: none comes
            st.expected.pop(task)

    async def _on_end(self, st: _Stream) -> None:
        await self._release_all(st)
        await self._queue.put(_RunEnded(st.job_id))

    async def _on_close(self, msg: sink_pb2.SinkClose, st: _Stream) -> None:
        if st.ending is not None:
            await st.ending
        await self._release_all(st)
        self.stats.jobs_closed += 1
        self.stats.closed_states.append(scheduler_pb2.JobState.Name(msg.state))
        await self._queue.put(_JobClosed(st.job_id))

    async def _release_all(self, st: _Stream) -> None:
        for task in sorted(st.groups):
            if st.groups[task]:
                await self._release(st, task)

    def _done_of(self, st: _Stream, group: Key) -> int:
        """Keys of `group` the trainer consumed before (a resumed job's)."""
        return sum(1 for k in self._committed[st.job_id] if st.group_of(k) == group)

    async def _release(self, st: _Stream, task: Key) -> None:
        group = st.groups.pop(task)
        st.expected.pop(task, None)
        for r in group:
            st.held.discard(r.key)
        await self._queue.put(group)

    def _track(self, st: _Stream, key: Key) -> None:
        st.unacked.add(key)
        self.stats.max_unacked = max(self.stats.max_unacked, len(st.unacked))

    async def _list_committed(self, job_id: str) -> sink_pb2.ListCommittedResponse:
        return sink_pb2.ListCommittedResponse(keys=_keys_pb(sorted(self._committed.get(job_id, set()))))


def _keys_pb(keys: Iterable[Key]) -> list[common_pb2.RolloutKey]:
    return [common_pb2.RolloutKey(task_index=t, rollout_index=r) for t, r in keys]


class _Servicer(sink_pb2_grpc.RolloutSinkServicer):
    def __init__(self, sink: SinkServer) -> None:
        self._sink = sink

    async def Consume(
        self, request_iterator: AsyncIterator[sink_pb2.ConsumeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[sink_pb2.ConsumeResponse]:
        async for resp in self._sink._consume(request_iterator, context):
            yield resp

    async def ListCommitted(
        self, request: sink_pb2.ListCommittedRequest, context: grpc.aio.ServicerContext
    ) -> sink_pb2.ListCommittedResponse:
        return await self._sink._list_committed(request.job_id)
