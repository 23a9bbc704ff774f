"""The default sink: appends a job's rows to its folder (layout and reading: `scheduler/store.py`).

Durability: rows are appended in batches; a batch is written and fsynced every `fsync_every`
rows, every `flush_interval_s` seconds while rows wait, and on close. The file I/O runs in a
worker thread (`asyncio.to_thread`), one batch at a time, in order. A crash loses at most the
rows of the unflushed batch (the resumed job re-runs them) and may leave a torn last line:
`open()` truncates each file to its last complete line and logs `sink_torn_tail_repaired`.

A write that fails (ENOSPC, EIO) is all or nothing: the files are cut back to where the batch
began, its keys are forgotten (never counted as written), and the sink is broken from then on:
every later call raises `SinkWriteFailed` with the first reason, `on_error` is called once (the
job manager fails the job at once), and `close()` keeps what was on disk before the batch.
`rows_written` / `failures_written` / `reward_written` / `masked_written` count only rows that
reached the disk.

metrics.json, written on close when the job gives no metrics of its own, counts what the folder
holds: the rows of earlier runs, read back from rollouts.jsonl up to where this run began appending,
and the rows of this run that reached the disk, from what the sink kept of each when it wrote it
(`Scored.stored`: what reading the row back gives, without parsing this run's rows again). On a
filesystem without flock another writer could have appended too: then the whole file is read back.

One writer: `open()` first takes an exclusive lock on the folder's `writer.lock` (flock, released
when the sink closes or its process dies, so a crashed job resumes at once). While another process
holds it (that job runs there now, or its process hangs) `open()` raises `JobFolderInUse` naming
the holder, having touched nothing, and `close()` then writes nothing either. (flock is local:
two hosts sharing the folder over NFS are not kept apart; on a filesystem that refuses flock the
job runs without the lock, with the warning `sink_writer_lock_unsupported`.)

Exactly once: `open()` returns the keys already in rollouts.jsonl; writing a key that is already
there (or was written in this run) raises `DuplicateRollout`. Failed keys are *not* returned,
so a resumed job retries its failures: `open()` moves their old rows to failures.retried.jsonl,
so failures.jsonl holds each standing failure once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler import store
from rollmesh.scheduler.errors import DuplicateRollout
from rollmesh.scheduler.errors import JobFolderInUse
from rollmesh.scheduler.errors import RolloutTooLarge
from rollmesh.scheduler.errors import SinkClosed
from rollmesh.scheduler.errors import SinkWriteFailed
from rollmesh.scheduler.metrics import Packed
from rollmesh.scheduler.metrics import Scored
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.metrics import measured_reward
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.row_text import ENCODE as ROW_ENCODE
from rollmesh.scheduler.row_text import row_text
from rollmesh.scheduler.sinks.base import MetricsOf
from rollmesh.scheduler.sinks.base import Sink

log = get_logger("rollmesh.scheduler.sinks.jsonl")


@dataclass(frozen=True)
class _Row:
    key: RolloutKey
    data: bytes
    reward: float | None = None  # metrics.measured_reward (None: masked)
    scored: Packed | None = None  # a rollout row's Scored, packed: for metrics.json once on disk


class JsonlSink(Sink):
    """Writes a job's rows under `directory` (use `store.job_dir(output_dir, job_id)`)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        fsync_every: int = 64,
        flush_interval_s: float = 2.0,
        k_values: list[int] | None = None,
    ) -> None:
        if fsync_every < 1:
            raise ValueError(f"fsync_every must be >= 1, got {fsync_every}")
        self.directory = Path(directory)
        self.fsync_every = fsync_every
        self.flush_interval_s = flush_interval_s
        self.k_values = k_values
        self._job_id = ""
        self._num_repeats: int | None = None
        self._keys: set[RolloutKey] = set()
        self._failed_this_run: set[RolloutKey] = set()
        self._rows: list[_Row] = []
        self._failure_rows: list[_Row] = []
        self._oldest: float | None = None
        self._fds: dict[str, int] = {}  # file name -> append-only descriptor
        self._lock_fd: int | None = None  # writer.lock, flocked while the sink is open
        self.owned_folder = False  # it held the folder's lock (so job.json is this run's to write)
        self._io_lock = asyncio.Lock()
        self._tasks = TaskSet()
        self._closed = False
        self.error: SinkWriteFailed | None = None  # set once a write failed; the sink takes no more
        self.fsyncs = 0  # batches written and fsynced (for tests and logs)
        self.flushed = asyncio.Event()  # set after every batch is written and fsynced
        self.rows_written = 0  # rollouts of this run on disk
        self.failures_written = 0  # failures of this run on disk
        self.reward_written = 0.0  # sum of the measured rewards of rows_written (masked ones left out)
        self.masked_written = 0  # rows_written whose verdict was masked
        self._lost: set[RolloutKey] = set()  # rollouts of this run a failed write never stored
        self._flocked = False  # it holds writer.lock's flock: no other writer appends
        self._earlier_bytes: int | None = None  # rollouts.jsonl's size at open (None: read it all back)
        self._stored: list[Packed] = []  # what metrics read of this run's rows on disk (packed), in order

    @property
    def keys(self) -> frozenset[RolloutKey]:
        return frozenset(self._keys)

    async def open(self, job_id: str, *, total: int, spec: dict[str, Any]) -> set[RolloutKey]:
        self._job_id = job_id
        try:
            self._num_repeats = int(spec.get("num_repeats") or 0) or None
        except (TypeError, ValueError):
            self._num_repeats = None
        if not self.k_values and isinstance(spec.get("k_values"), list) and spec["k_values"]:
            self.k_values = [int(k) for k in spec["k_values"]]
        keys = await asyncio.to_thread(self._open_files)
        self._keys = set(keys)
        log.info("sink_opened", job_id=job_id, directory=str(self.directory), existing=len(keys), total=total)
        if self.flush_interval_s > 0:
            self._tasks.spawn(self._flush_periodically(), name=f"jsonl-sink-flush-{job_id}")
        return set(keys)

    def _open_files(self) -> set[RolloutKey]:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_folder()
        for name in (store.ROLLOUTS, store.FAILURES):
            removed = store.repair_torn_tail(self.directory / name)
            if removed:
                log.warning("sink_torn_tail_repaired", file=str(self.directory / name), bytes_removed=removed)
        keys = store.read_keys(self.directory / store.ROLLOUTS)
        if self._flocked:  # the only writer: what is appended from here on is this run's
            rollouts = self.directory / store.ROLLOUTS
            self._earlier_bytes = rollouts.stat().st_size if rollouts.exists() else 0
        retired = store.retire_failures(self.directory)
        if retired:
            log.info("sink_failures_retried", directory=str(self.directory), rows=retired)
        for name in (store.ROLLOUTS, store.FAILURES):
            self._fds[name] = os.open(self.directory / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return keys

    def _lock_folder(self) -> None:
        fd = os.open(self.directory / store.WRITER_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._flocked = True
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise JobFolderInUse(
                f"{self.directory} is being written by {holder}: that run of the job is still going "
                "(or its process hangs); wait for it to end, or stop it, then resume",
                metadata={"directory": str(self.directory), "holder": holder},
            ) from None
        except OSError as exc:  # a filesystem without flock (some NFS/FUSE mounts): run, unguarded
            log.warning("sink_writer_lock_unsupported", directory=str(self.directory), error=str(exc))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._lock_fd = fd
        self.owned_folder = True

    async def write(self, rollout: Rollout) -> None:
        self._check_open()
        if rollout.key in self._keys:
            raise DuplicateRollout(
                f"rollout {rollout.key.as_str()} is already in {self.directory / store.ROLLOUTS}",
                metadata={"key": rollout.key.as_str()},
            )
        self._keys.add(rollout.key)
        self._rows.append(_row(rollout))
        await self._after_append()

    async def write_group(self, rollouts: Sequence[Rollout]) -> list[tuple[Rollout, RolloutTooLarge]]:
        """The group's rows go into the buffer together (checked first: none of a group that repeats
        a key is taken), so one batch, one append, holds them all."""
        self._check_open()
        keys = [r.key for r in rollouts]
        held = next((k for k in keys if k in self._keys), None)
        if held is not None or len(set(keys)) < len(keys):
            key = held or next(k for k in keys if keys.count(k) > 1)
            raise DuplicateRollout(
                f"rollout {key.as_str()} is already in {self.directory / store.ROLLOUTS}",
                metadata={"key": key.as_str()},
            )
        for rollout in rollouts:
            self._keys.add(rollout.key)
            self._rows.append(_row(rollout))
        await self._after_append()
        return []

    async def write_failure(self, failure: RolloutFailure) -> None:
        self._check_open()
        if failure.key in self._failed_this_run or failure.key in self._keys:
            raise DuplicateRollout(
                f"rollout {failure.key.as_str()} already has a row in {self.directory}",
                metadata={"key": failure.key.as_str()},
            )
        self._failed_this_run.add(failure.key)
        self._failure_rows.append(_Row(failure.key, _dumps(failure.to_row())))
        await self._after_append()

    async def _after_append(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()
        if len(self._rows) + len(self._failure_rows) >= self.fsync_every:
            await self.flush()

    async def flush(self) -> None:
        """Write and fsync what is buffered (one batch at a time, in order); all or nothing."""
        async with self._io_lock:
            self._check_healthy()
            rows, self._rows = self._rows, []
            failure_rows, self._failure_rows = self._failure_rows, []
            self._oldest = None
            if not rows and not failure_rows:
                return
            try:
                await asyncio.to_thread(self._write_batch, rows, failure_rows)
            except OSError as exc:
                self._break(exc, rows, failure_rows)
            self._check_healthy()  # raises once _break latched the error
            self.fsyncs += 1
            self.rows_written += len(rows)
            self.failures_written += len(failure_rows)
            self.reward_written += sum(r.reward for r in rows if r.reward is not None)
            self.masked_written += sum(r.reward is None for r in rows)
            self._stored.extend(r.scored for r in rows if r.scored is not None)
            self.flushed.set()

    def _write_batch(self, rows: list[_Row], failure_rows: list[_Row]) -> None:
        """Append both files and fsync them; on error cut both back to where the batch began."""
        batches = [(store.ROLLOUTS, rows), (store.FAILURES, failure_rows)]
        starts = {name: os.fstat(self._fds[name]).st_size for name, batch in batches if batch}
        try:
            for name, batch in batches:
                if batch:
                    self._append(self._fds[name], b"".join(r.data for r in batch))
                    os.fsync(self._fds[name])
        except OSError:
            for name, size in starts.items():
                with contextlib.suppress(OSError):  # truncating frees space, so it works on a full disk
                    os.ftruncate(self._fds[name], size)
                    os.fsync(self._fds[name])
            raise

    @staticmethod
    def _append(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def _break(self, exc: OSError, rows: list[_Row], failure_rows: list[_Row]) -> None:
        """Latch the first write error; the failed batch's keys (and anything still buffered) were
        never written, so they are forgotten."""
        lost = rows + failure_rows + self._rows + self._failure_rows
        self._lost |= {r.key for r in rows + self._rows}
        self._rows, self._failure_rows, self._oldest = [], [], None
        for r in lost:
            self._keys.discard(r.key)
            self._failed_this_run.discard(r.key)
        reason = f"{exc.strerror or exc}" + (f" (errno {exc.errno})" if exc.errno else "")
        self.error = SinkWriteFailed(
            f"the JSONL sink could not write to {self.directory}: {reason}; {len(lost)} rows were not "
            f"stored. Rows already on disk are kept; free the space or fix the disk, then resume the job",
            metadata={"directory": str(self.directory), "errno": str(exc.errno or "")},
        )
        log.error(
            "sink_write_failed",
            job_id=self._job_id,
            directory=str(self.directory),
            error=reason,
            lost=len(lost),
        )
        if self.on_error is not None:
            self.on_error(self.error)

    def _check_healthy(self) -> None:
        if self.error is not None:
            raise SinkWriteFailed(self.error.message, metadata=dict(self.error.metadata))

    async def _flush_periodically(self) -> None:
        while not self._closed and self.error is None:
            await asyncio.sleep(self.flush_interval_s)
            if self._oldest is not None and time.monotonic() - self._oldest >= self.flush_interval_s:
                with contextlib.suppress(SinkWriteFailed):  # latched; reported through on_error
                    await self.flush()

    def not_stored(self) -> frozenset[RolloutKey]:
        return frozenset(self._lost | {r.key for r in self._rows})

    async def close(self, *, state: str, metrics: MetricsOf | None) -> None:
        """Flush and fsync, then write metrics.json: `metrics()` when given, else recomputed from the
        whole folder (rows of earlier runs included). A broken sink writes what is on disk (or, when
        even that fails, removes a stale metrics.json) and raises nothing more: its error is known."""
        if self._closed:
            return
        try:
            if self.error is None and self._lock_fd is not None:
                with contextlib.suppress(SinkWriteFailed):
                    await self.flush()
        finally:
            self._closed = True
            await self._tasks.aclose()
            await asyncio.to_thread(self._close_files)
        if self._lock_fd is None:  # never opened (or the folder is another writer's): touch nothing
            return
        try:
            await self._write_metrics(state, metrics)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        log.info("sink_closed", job_id=self._job_id, state=state, rows=self.rows_written, fsyncs=self.fsyncs)

    async def _write_metrics(self, state: str, metrics: MetricsOf | None) -> None:
        if metrics is None or self.error is not None:
            computed = await asyncio.to_thread(self.recompute_metrics)
        else:
            computed = metrics()
        data = {**computed, **(self.extra_metrics or {}), "job_state": state}
        try:
            await asyncio.to_thread(store.write_json_atomic, self.directory / store.METRICS, data)
        except OSError as exc:
            if self.error is None:
                raise
            log.error("sink_metrics_not_written", job_id=self._job_id, error=str(exc))
            with contextlib.suppress(OSError):
                (self.directory / store.METRICS).unlink()

    def recompute_metrics(self) -> Json:
        """The metrics of what the folder holds (module doc; blocking: call from a thread)."""
        upto = self._earlier_bytes
        rollouts, failures = store.load_scored(self.directory, rollouts_upto=upto)
        if upto is not None:
            rollouts += map(Scored.unpack, self._stored)
        return compute(
            rollouts,
            failures,
            k_values=self.k_values,
            num_repeats=self._num_repeats,
            job_id=self._job_id,
            sink_writes=self.write_times,
        ).to_json()

    def _close_files(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = {}

    def _check_open(self) -> None:
        if self._closed or not self._fds:
            raise SinkClosed(f"the sink at {self.directory} is not open")
        self._check_healthy()


def _row(rollout: Rollout) -> _Row:
    # The row's timing, rounded once: its text and the summary's timing (rounded_values_of_json).
    timing = rollout.timing.to_json() if rollout.timing is not None else None
    summary = Scored.stored_packed(rollout, timing)
    return _Row(rollout.key, (row_text(rollout, timing) + "\n").encode(), measured_reward(rollout), summary)


def _dumps(row: Json) -> bytes:
    # One encoder for every row (json.dumps with these arguments builds a new one per call). No check
    # for circular references (a dict of ids per container of every row): a row is built from JSON
    # values and protobuf messages, which have none.
    return (ROW_ENCODE(row) + "\n").encode()
