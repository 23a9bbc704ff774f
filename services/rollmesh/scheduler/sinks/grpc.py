"""The gRPC sink: streams a job's rollouts to a trainer's `RolloutSink` service.

`open()` asks `ListCommitted` for the keys the trainer already consumed (a resumed job skips
them), then opens one `Consume` stream and sends `SinkOpen`. `write()` waits for credit: never
more than `window` rollouts are sent and not yet acknowledged, so a slow trainer slows dispatch.
Failures are sent outside the window (the trainer need not ack them). `close()` sends `SinkEnd`
(the trainer releases what it holds: its last partial batch, whose acknowledgements it keeps until
the trainer is done with it), waits until every rollout is acknowledged (while acks keep coming,
none `drain_timeout_s` apart: a trainer that dies in its last step never acknowledges it), sends
`SinkClose` with the metrics and the final state, half-closes and waits for the trainer to end the
stream. Rollouts still not acknowledged then (the trainer stalled past `drain_timeout_s`, or the
stream broke) make the SinkClose say FAILED and, when the job would have ended SUCCEEDED or
COMPLETED_WITH_FAILURES, `close()` raise `SinkUnavailable`: the job fails, never a success with
rows the trainer lacks.

If the stream breaks, `write()` raises `SinkUnavailable` (UNAVAILABLE); rollouts sent but not
acknowledged are not committed on the trainer, so a resumed job sends them again.

A trainer that keeps the window full and acknowledges nothing for WAIT_SHOWN_AFTER_S (a training
step, or a hung trainer) is not yet an error: dispatch waits, and `waiting()` says so, which the
job's progress shows (`waiting_on`, `rollmesh run`'s bar, `rollmesh jobs status`). Past
`ack_timeout_s` (GrpcSinkSpec.ack_timeout_s, default 300 s: an optimizer step may take minutes) it
is: `write()` raises `SinkUnavailable` and the job fails (a trainer alive enough to answer
keepalive pings but stuck, e.g. a deadlocked loop, stalled the job forever); so does a write
the trainer has not read for that long (with its queue full it stops reading); what it never
acknowledged is not committed, so a resumed job sends it again. The clock runs from the later of
the last acknowledgement and the moment rollouts began waiting for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import grpc

from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler import convert
from rollmesh.scheduler import telemetry
from rollmesh.scheduler.errors import RolloutTooLarge
from rollmesh.scheduler.errors import SinkUnavailable
from rollmesh.scheduler.metrics import measured_reward
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.sinks.base import MetricsOf
from rollmesh.scheduler.sinks.base import Sink
from rollmesh_client import aio_channel
from rollmesh_client import max_message_bytes
from rollmesh_client.v1 import scheduler_pb2
from rollmesh_client.v1 import sink_pb2
from rollmesh_client.v1 import sink_pb2_grpc

log = get_logger("rollmesh.scheduler.sinks.grpc")

WAIT_SHOWN_AFTER_S = 5.0  # a full window with no acknowledgement for this long shows in progress
ACK_TIMEOUT_S = 300.0  # ... and fails the job (GrpcSinkSpec.ack_timeout_s)
_SUCCESS = frozenset({scheduler_pb2.JOB_STATE_SUCCEEDED, scheduler_pb2.JOB_STATE_COMPLETED_WITH_FAILURES})


class GrpcSink(Sink):
    def __init__(
        self,
        address: str,
        *,
        window: int = 64,
        api_key: str | None = None,
        rpc_timeout_s: float = 30.0,
        drain_timeout_s: float | None = None,
        ack_timeout_s: float | None = None,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        """`ack_timeout_s` (None: ACK_TIMEOUT_S): no acknowledgement for this long with the window
        full fails the job; `drain_timeout_s` (None: `ack_timeout_s`): the same for the last ones."""
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.address = address
        self.window = window
        self.rpc_timeout_s = rpc_timeout_s
        self.ack_timeout_s = ack_timeout_s or ACK_TIMEOUT_S
        self.drain_timeout_s = self.ack_timeout_s if drain_timeout_s is None else drain_timeout_s
        self._own_channel = channel is None
        self._channel = channel if channel is not None else aio_channel(address, api_key=api_key)
        self._stub = sink_pb2_grpc.RolloutSinkStub(self._channel)
        self._max_bytes = max_message_bytes()
        self._call: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._unacked: dict[RolloutKey, float | None] = {}  # sent, not acknowledged: key -> measured_reward
        self._held: dict[
            RolloutKey, float | None
        ] = {}  # held by the trainer for their group: out of the window
        self._cond = asyncio.Condition()
        self._error: BaseException | None = None
        self._send_lock = asyncio.Lock()
        self._job_id = ""
        self._closed = False
        self.max_unacked_seen = 0  # the largest in-flight count observed (tests, logs)
        self.acked = 0
        self._last_ack = time.monotonic()  # when the trainer last acknowledged (or the sink opened)
        self._unacked_since = time.monotonic()  # when the unacknowledged set last became non-empty
        self._stalled = False  # the trainer acknowledged nothing for ack_timeout_s: no drain wait
        self._draining = False  # close() waits for the last acknowledgements

    @property
    def in_flight(self) -> int:
        return len(self._unacked)

    def _quiet_s(self) -> float:
        """Seconds rollouts have waited for an acknowledgement that did not come."""
        return time.monotonic() - max(self._last_ack, self._unacked_since)

    def waiting(self) -> str:
        quiet, draining = self._quiet_s(), self._draining and self._owed() > 0  # the job's last ones
        if not (draining or len(self._unacked) >= self.window) or quiet < WAIT_SHOWN_AFTER_S:
            return ""
        n, what = (self._owed(), "the job's last") if draining else (len(self._unacked), "the window")
        said = f"trainer sink at {self.address} acknowledged nothing for {quiet:.0f} s"
        return f"{said} ({n} unacknowledged, {what})"

    async def open(self, job_id: str, *, total: int, spec: dict[str, Any]) -> set[RolloutKey]:
        self._job_id = job_id
        try:  # a trainer starting beside the job gets rpc_timeout_s to start listening
            resp = await self._stub.ListCommitted(
                sink_pb2.ListCommittedRequest(job_id=job_id), timeout=self.rpc_timeout_s, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise SinkUnavailable(
                    f"trainer sink {self.address}: not reachable within {self.rpc_timeout_s:g}s "
                    f"({exc.code().name}): is the trainer's RolloutSink listening there? (docs/training.md)"
                ) from None
            raise SinkUnavailable(
                f"trainer sink {self.address}: ListCommitted failed: {exc.code().name} {exc.details()}"
            ) from None
        committed = {convert.key_from_pb(k) for k in resp.keys}
        try:
            spec_pb = convert.spec_to_pb(spec)
        except Exception as exc:  # a spec dict that is not JobSpec-shaped: the trainer gets none
            log.warning("sink_spec_not_converted", job_id=job_id, error=str(exc))
            spec_pb = scheduler_pb2.JobSpec()
        # A job-long stream: no overall deadline; each write and the drain have their own bounds.
        self._call = self._stub.Consume()
        self._reader = asyncio.create_task(self._read_acks(), name=f"grpc-sink-acks-{job_id}")
        await self._send(
            sink_pb2.ConsumeRequest(
                open=sink_pb2.SinkOpen(
                    job_id=job_id, spec=spec_pb, total=total, window=self.window, sends_end=True
                )
            )
        )
        log.info(
            "sink_opened", job_id=job_id, address=self.address, committed=len(committed), window=self.window
        )
        return committed

    async def write(self, rollout: Rollout) -> None:
        msg = sink_pb2.ConsumeRequest(rollout=convert.rollout_to_pb(rollout))
        if msg.ByteSize() > self._max_bytes:  # grpc would break the stream with "Internal error from Core"
            raise RolloutTooLarge(  # that rollout fails (never sent); the stream and the job go on
                f"rollout {rollout.key.as_str()} is {msg.ByteSize() / 2**20:.1f} MiB, over the "
                f"{self._max_bytes / 2**20:g} MiB gRPC message limit (raise ROLLMESH_MAX_MESSAGE_MB for "
                "the scheduler and the trainer)"
            )
        async with self._cond:
            while self._error is None and len(self._unacked) >= self.window:
                left = self.ack_timeout_s - self._quiet_s()
                if left <= 0:
                    self._stalled = True
                    raise SinkUnavailable(
                        f"trainer sink at {self.address} acknowledged nothing for {self._quiet_s():.0f} s "
                        f"with its window full ({len(self._unacked)} unacknowledged; GrpcSinkSpec."
                        f"ack_timeout_s {self.ack_timeout_s:g} s): they are not committed, and a resume "
                        "sends them again",
                        metadata={"unacked": str(len(self._unacked))},
                    )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._cond.wait()
            self._raise_if_broken()
            if not self._unacked:
                self._unacked_since = time.monotonic()
            self._unacked[rollout.key] = measured_reward(rollout)
            self.max_unacked_seen = max(self.max_unacked_seen, len(self._unacked))
        try:
            await self._send(msg)
        except BaseException:  # not written: the job does not count it
            self._unacked.pop(rollout.key, None)
            raise

    async def write_failure(self, failure: RolloutFailure) -> None:
        self._raise_if_broken()
        await self._send(sink_pb2.ConsumeRequest(failure=convert.failure_to_pb(failure)))

    def not_stored(self) -> frozenset[RolloutKey]:
        return frozenset(self._unacked.keys() | self._held.keys())

    async def close(self, *, state: str, metrics: MetricsOf | None) -> None:
        if self._closed:
            return
        self._closed = True
        # A cancel does not wait for the trainer to train what it holds (steps of minutes outlasted
        # CancelJob's deadline): the close says CANCELLED, and what is unacknowledged is not counted.
        cancelled = convert.state_to_pb(state) == scheduler_pb2.JOB_STATE_CANCELLED
        try:
            if self._call is None:
                return
            if self._error is None and not self._stalled:
                with contextlib.suppress(SinkUnavailable):  # a broken stream: said below
                    await self._send(sink_pb2.ConsumeRequest(end=sink_pb2.SinkEnd()))
                # Bounded like the run: no ack for drain_timeout_s since the end (or the last ack). A
                # bound on the whole drain failed a healthy trainer with a batch or two still to train.
                self._unacked_since, self._draining = time.monotonic(), True
                async with self._cond:
                    while not cancelled and self._error is None and self._owed():
                        if (left := self.drain_timeout_s - self._quiet_s()) <= 0:
                            log.warning("sink_drain_timeout", job_id=self._job_id, unacked=self._owed())
                            break
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(left):
                                await self._cond.wait()
            if self._error is None:
                # Rollouts still unacked (the trainer stalled past drain_timeout_s): not delivered.
                failed = self._owed() and not cancelled
                close = sink_pb2.SinkClose(state=convert.state_to_pb("FAILED" if failed else state))
                if metrics is not None:  # after the drain: over what the trainer acknowledged
                    close.metrics.CopyFrom(convert.metrics_to_pb(metrics()))
                await self._send(sink_pb2.ConsumeRequest(close=close))
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await self._call.done_writing()
                if self._reader is not None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(self._reader), timeout=self.rpc_timeout_s)
            log.info(
                "sink_closed",
                job_id=self._job_id,
                state=state,
                acked=self.acked,
                unacked=self._owed(),
                max_unacked=self.max_unacked_seen,
            )
        finally:
            if self._reader is not None:
                self._reader.cancel()
                await asyncio.gather(self._reader, return_exceptions=True)
            if self._call is not None:
                self._call.cancel()
            if self._own_channel:
                await self._channel.close()
        if self.on_unconsumed is not None:  # what the trainer never took has not succeeded
            for reward in [*self._unacked.values(), *self._held.values()]:
                self.on_unconsumed(reward, False)
        if self._owed() and convert.state_to_pb(state) in _SUCCESS:
            cause = _describe(self._error) if self._error is not None else "no ack within drain_timeout_s"
            raise SinkUnavailable(
                f"trainer sink {self.address}: {self._owed()} rollouts sent were never acknowledged "
                f"({cause}); they are not committed, and a resume sends them again",
                metadata={"unacked": str(self._owed())},
            )

    def _owed(self) -> int:
        """Rollouts sent that the trainer has not consumed: in the window, or held for their group."""
        return len(self._unacked) + len(self._held)

    async def _send(self, req: sink_pb2.ConsumeRequest) -> None:
        if self._call is None:
            raise SinkUnavailable(f"trainer sink {self.address}: write before open()")
        self._raise_if_broken()
        try:
            # A trainer in a long step stops reading once its queue is full, and flow control then
            # holds writes: backpressure like a full window (rpc_timeout_s failed healthy jobs).
            async with self._send_lock, asyncio.timeout(self.ack_timeout_s):
                await self._call.write(req)
        except TimeoutError:
            await self._fail(
                TimeoutError(f"the trainer read nothing for ack_timeout_s {self.ack_timeout_s:g} s")
            )
            self._raise_if_broken()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
            await self._fail(exc)
            self._raise_if_broken()

    async def _read_acks(self) -> None:
        try:
            while True:
                resp = await self._call.read()
                if resp is grpc.aio.EOF:
                    if not self._closed:
                        await self._fail(ConnectionError("the trainer ended the Consume stream"))
                    return
                held = {convert.key_from_pb(k) for k in resp.held} & self._unacked.keys()
                keys = {convert.key_from_pb(k) for k in resp.acked} & (
                    self._unacked.keys() | self._held.keys()
                )
                if keys or held:  # acks of keys not waiting (unknown, repeated) are no sign of progress
                    self._last_ack = time.monotonic()
                stale = {convert.key_from_pb(k) for k in resp.dropped_stale} & keys
                async with self._cond:
                    for key in held:  # out of the window, still owed an ack
                        self._held[key] = self._unacked.pop(key)
                    for key in keys:
                        reward = self._unacked.pop(key) if key in self._unacked else self._held.pop(key)
                        if key in stale and self.on_unconsumed is not None:
                            self.on_unconsumed(reward, True)
                        if key in stale and self.on_stale is not None:
                            self.on_stale(key)
                    self.acked += len(keys)
                    telemetry.SINK_ACKS.labels("consumed").inc(len(keys - stale))
                    telemetry.SINK_ACKS.labels("stale").inc(len(stale))
                    self._cond.notify_all()
        except grpc.aio.AioRpcError as exc:
            await self._fail(exc)

    async def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
            log.warning("sink_stream_broken", job_id=self._job_id, address=self.address, error=_describe(exc))
        async with self._cond:
            self._cond.notify_all()

    def _raise_if_broken(self) -> None:
        if self._error is not None:
            raise SinkUnavailable(
                f"trainer sink {self.address} stream broke with {self._owed()} rollouts "
                f"unacknowledged: {_describe(self._error)}"
            )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
