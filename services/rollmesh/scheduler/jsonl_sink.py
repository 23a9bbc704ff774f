"""The default sink: one folder per job, crash-safe and resumable.

    <dir>/rollouts.jsonl   one NeMo Gym-compatible row per rollout (`Rollout.to_row`)
    <dir>/failures.jsonl   one row per rollout that failed after every retry (`RolloutFailure.to_row`)
    <dir>/metrics.json     written on close (`rollmesh aggregate` recomputes it from the rows)
    <dir>/spec.json        the job spec of the last run that opened the folder

Durability: rows are appended in batches; a batch is written and fsynced every `fsync_every`
rows, every `flush_interval_s` seconds while rows wait, and on close. The file I/O runs in a
worker thread (`asyncio.to_thread`), one batch at a time, in order. A crash loses at most the
rows of the unflushed batch (the resumed job re-runs them) and may leave a torn last line:
`open()` truncates each file to its last complete line and logs `sink_torn_tail_repaired`.

Exactly once: `open()` returns the keys already in rollouts.jsonl; writing a key that is already
there (or was written in this run) raises `DuplicateRollout`. Failed keys are *not* returned,
so a resumed job retries its failures; their old rows stay in failures.jsonl as history, and
metrics ignore a failure whose key later got a rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.errors import AlreadyExists, FailedPrecondition
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler.metrics import compute_metrics
from rollmesh.scheduler.records import Json, Rollout, RolloutFailure, RolloutKey
from rollmesh.scheduler.sink import Sink

log = get_logger("rollmesh.scheduler.jsonl_sink")
T = TypeVar("T")

ROLLOUTS = "rollouts.jsonl"
FAILURES = "failures.jsonl"
METRICS = "metrics.json"
SPEC = "spec.json"


class DuplicateRollout(AlreadyExists):
    """A key was written twice: the sink keeps every key exactly once."""

    reason = "DUPLICATE_ROLLOUT"


class CorruptSinkFile(FailedPrecondition):
    """A complete line of a sink file is not a JSON object (not a torn tail: that is repaired)."""

    reason = "SINK_FILE_CORRUPT"


class SinkClosed(FailedPrecondition):
    reason = "SINK_CLOSED"


def job_dir(output_dir: str | os.PathLike[str], job_id: str) -> Path:
    """Where a job's JSONL sink writes: <output_dir>/<job_id>/."""
    return Path(output_dir) / job_id


def repair_torn_tail(path: Path) -> int:
    """Truncate `path` to its last complete line; return the bytes removed (0 when intact)."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with path.open("rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Scan back in blocks for the last newline.
        pos = size
        keep = 0
        block = 64 * 1024
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            idx = chunk.rfind(b"\n")
            if idx >= 0:
                keep = start + idx + 1
                break
            pos = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return size - keep


def iter_rows(path: Path) -> Iterator[tuple[int, Json]]:
    """(line number, row) for every non-blank line; a malformed line raises CorruptSinkFile.

    A last line without its newline that does not parse is skipped: it is a row being appended
    (a live file) or a torn tail (repaired when a sink next opens the folder)."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                if not raw.endswith(b"\n"):
                    log.debug("sink_partial_last_line_skipped", file=str(path), line=lineno)
                    return
                raise CorruptSinkFile(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise CorruptSinkFile(f"{path}:{lineno}: not a JSON object")
            yield lineno, row


def read_keys(path: Path) -> set[RolloutKey]:
    keys: set[RolloutKey] = set()
    if not path.exists():
        return keys
    for lineno, row in iter_rows(path):
        try:
            keys.add(RolloutKey(int(row["task_index"]), int(row["rollout_index"])))
        except (KeyError, TypeError, ValueError):
            raise CorruptSinkFile(f"{path}:{lineno}: row has no task_index/rollout_index") from None
    return keys


def load_dir(directory: Path) -> tuple[list[Rollout], list[RolloutFailure]]:
    """Every rollout and failure a sink folder holds (blocking; call from a thread)."""
    rollouts = (
        [Rollout.from_row(row) for _, row in iter_rows(directory / ROLLOUTS)]
        if (directory / ROLLOUTS).exists()
        else []
    )
    failures = (
        [RolloutFailure.from_row(row) for _, row in iter_rows(directory / FAILURES)]
        if (directory / FAILURES).exists()
        else []
    )
    return rollouts, failures


@dataclass
class LoadedResults:
    """Rows of one or more sink files (shards of one job), keys deduplicated (first file wins)."""

    rollouts: list[Rollout] = field(default_factory=list)
    failures: list[RolloutFailure] = field(default_factory=list)
    duplicates: int = 0
    files: list[Path] = field(default_factory=list)


def expand_paths(patterns: Sequence[str]) -> list[Path]:
    """Globs, files and sink folders (-> their rollouts.jsonl and failures.jsonl), in order, once each.
    A file named rollouts.jsonl brings the failures.jsonl next to it."""
    out: list[Path] = []
    for pattern in patterns:
        matches = (
            sorted(Path(p) for p in glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else []
        )
        if not matches:
            path = Path(pattern)
            if not path.exists():
                raise FileNotFoundError(
                    f"{pattern}: no such file"
                    + (" (the glob matched nothing)" if glob.has_magic(pattern) else "")
                )
            matches = [path]
        for m in matches:
            if m.is_dir():
                found = [m / ROLLOUTS, m / FAILURES]
            elif m.name == ROLLOUTS:  # a sink's rollouts file brings its failures sidecar along
                found = [m, m.parent / FAILURES]
            else:
                found = [m]
            for f in found:
                if f.is_file() and f.resolve() not in {o.resolve() for o in out}:
                    out.append(f)
    if not out:
        raise FileNotFoundError(f"no rollout files in {' '.join(patterns)}")
    return out


def is_failures_file(path: Path) -> bool:
    return path.name.startswith("failures")


def read_rollout_rows(path: Path) -> list[tuple[int, Json]]:
    """(line number, row) of a rollouts file, each row checked to parse as a Rollout."""
    rows: list[tuple[int, Json]] = []
    for lineno, row in iter_rows(path):
        _parse(path, lineno, row, Rollout.from_row)
        rows.append((lineno, row))
    return rows


def load_files(paths: Sequence[Path]) -> LoadedResults:
    """Rollouts and failures of many files as one run (blocking; call from a thread)."""
    res = LoadedResults(files=list(paths))
    seen: set[RolloutKey] = set()
    for path in paths:
        if is_failures_file(path):
            for lineno, row in iter_rows(path):
                res.failures.append(_parse(path, lineno, row, RolloutFailure.from_row))
            continue
        for lineno, row in iter_rows(path):
            r = _parse(path, lineno, row, Rollout.from_row)
            if r.key in seen:
                res.duplicates += 1
                continue
            seen.add(r.key)
            res.rollouts.append(r)
    return res


def _parse(path: Path, lineno: int, row: Json, parse: Callable[[Json], T]) -> T:
    try:
        return parse(row)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptSinkFile(f"{path}:{lineno}: not a rollmesh row ({type(exc).__name__}: {exc})") from None


class JsonlSink(Sink):
    """Writes a job's rows under `directory` (use `job_dir(output_dir, job_id)`)."""

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
        self._rows: list[bytes] = []
        self._failure_rows: list[bytes] = []
        self._oldest: float | None = None
        self._rollouts_f: IO[bytes] | None = None
        self._failures_f: IO[bytes] | None = None
        self._io_lock = asyncio.Lock()
        self._tasks = TaskSet()
        self._closed = False
        self.fsyncs = 0  # batches written and fsynced (for tests and logs)
        self.flushed = asyncio.Event()  # set after every batch is written and fsynced
        self.rows_written = 0

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
        keys = await asyncio.to_thread(self._open_files, spec)
        self._keys = set(keys)
        log.info("sink_opened", job_id=job_id, directory=str(self.directory), existing=len(keys), total=total)
        if self.flush_interval_s > 0:
            self._tasks.spawn(self._flush_periodically(), name=f"jsonl-sink-flush-{job_id}")
        return set(keys)

    def _open_files(self, spec: dict[str, Any]) -> set[RolloutKey]:
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in (ROLLOUTS, FAILURES):
            removed = repair_torn_tail(self.directory / name)
            if removed:
                log.warning("sink_torn_tail_repaired", file=str(self.directory / name), bytes_removed=removed)
        keys = read_keys(self.directory / ROLLOUTS)
        (self.directory / SPEC).write_text(json.dumps(spec, indent=2, default=str) + "\n")
        self._rollouts_f = (self.directory / ROLLOUTS).open("ab")
        self._failures_f = (self.directory / FAILURES).open("ab")
        return keys

    async def write(self, rollout: Rollout) -> None:
        self._check_open()
        if rollout.key in self._keys:
            raise DuplicateRollout(
                f"rollout {rollout.key.as_str()} is already in {self.directory / ROLLOUTS}",
                metadata={"key": rollout.key.as_str()},
            )
        self._keys.add(rollout.key)
        self._rows.append(_dumps(rollout.to_row()))
        await self._after_append()

    async def write_failure(self, failure: RolloutFailure) -> None:
        self._check_open()
        if failure.key in self._failed_this_run or failure.key in self._keys:
            raise DuplicateRollout(
                f"rollout {failure.key.as_str()} already has a row in {self.directory}",
                metadata={"key": failure.key.as_str()},
            )
        self._failed_this_run.add(failure.key)
        self._failure_rows.append(_dumps(failure.to_row()))
        await self._after_append()

    async def _after_append(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()
        if len(self._rows) + len(self._failure_rows) >= self.fsync_every:
            await self.flush()

    async def flush(self) -> None:
        """Write and fsync what is buffered (one batch at a time, in order)."""
        async with self._io_lock:
            rows, self._rows = self._rows, []
            failure_rows, self._failure_rows = self._failure_rows, []
            self._oldest = None
            if not rows and not failure_rows:
                return
            await asyncio.to_thread(self._write_batch, rows, failure_rows)
            self.fsyncs += 1
            self.rows_written += len(rows)
            self.flushed.set()

    def _write_batch(self, rows: list[bytes], failure_rows: list[bytes]) -> None:
        for f, batch in ((self._rollouts_f, rows), (self._failures_f, failure_rows)):
            if not batch or f is None:
                continue
            f.write(b"".join(batch))
            f.flush()
            os.fsync(f.fileno())

    async def _flush_periodically(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.flush_interval_s)
            if self._oldest is not None and time.monotonic() - self._oldest >= self.flush_interval_s:
                await self.flush()

    async def close(self, *, state: str, metrics: dict[str, Any] | None) -> None:
        """Flush and fsync, then write metrics.json: `metrics` when given, else recomputed from the
        whole folder (rows of earlier runs included)."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            await self._tasks.aclose()
            await asyncio.to_thread(self._close_files)
        if metrics is None:
            metrics = await asyncio.to_thread(self.recompute_metrics)
        data = {**metrics, "job_state": state}
        await asyncio.to_thread(write_json_atomic, self.directory / METRICS, data)
        log.info("sink_closed", job_id=self._job_id, state=state, rows=self.rows_written, fsyncs=self.fsyncs)

    def recompute_metrics(self) -> Json:
        rollouts, failures = load_dir(self.directory)
        return compute_metrics(
            rollouts, failures, k_values=self.k_values, num_repeats=self._num_repeats, job_id=self._job_id
        )

    def _close_files(self) -> None:
        for f in (self._rollouts_f, self._failures_f):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._rollouts_f = self._failures_f = None

    def _check_open(self) -> None:
        if self._closed or self._rollouts_f is None:
            raise SinkClosed(f"the sink at {self.directory} is not open")


def _dumps(row: Json) -> bytes:
    return (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def write_json_atomic(path: Path, data: Json) -> None:
    """Write `data` as JSON so a crash leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
