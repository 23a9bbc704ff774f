"""The job store: the one owner of a job's output folder and of reading it back.

    <output_dir>/<job_id>/
      job.json                the job: spec as submitted (stored once, here), state, error, progress
      rollouts.jsonl          one NeMo Gym-compatible row per rollout (`Rollout.to_row`)
      failures.jsonl          one row per rollout whose failure stands (`RolloutFailure.to_row`)
      failures.retried.jsonl  history: failures a later run of the job retried (moved at open)
      metrics.json            written when the job ends (`rollmesh aggregate` recomputes it)
      writer.lock             flocked while a run writes the folder (holder: "pid N on HOST")
      services.log            `rollmesh run`'s embedded mesh: what Ray, Serve and vLLM printed
                              (commands/_quiet.py; services.2.log, ... for later runs of the job)

This module spells those names, reads a growing JSONL file (complete lines only: a last line
without its newline is a row being appended, or a torn tail that `repair_torn_tail` removes),
scans a results root for jobs (a restarted scheduler lists them; `--resume` finds the newest
unfinished job with the same rollouts), counts what is on disk, and loads sink files offline
(`rollmesh aggregate/export/...`). Writers: the JSONL sink appends rows; the job manager writes
job.json. JSON files are replaced atomically (`write_json_atomic`: a crash or a full disk leaves
the old file or the new one, and no `*.tmp`). Everything here blocks: call it via
`asyncio.to_thread` from async code.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TypeVar

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.errors import NotJson
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler.errors import CorruptSinkFile
from rollmesh.scheduler.errors import MixedJobs
from rollmesh.scheduler.metrics import Scored
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import RowKeys
from rollmesh.scheduler.records import row_masked
from rollmesh.scheduler.spec import JobSpec

log = get_logger("rollmesh.scheduler.store")
T = TypeVar("T")

JOB = "job.json"
ROLLOUTS = "rollouts.jsonl"
FAILURES = "failures.jsonl"
FAILURES_RETRIED = "failures.retried.jsonl"
METRICS = "metrics.json"
WRITER_LOCK = "writer.lock"  # flocked by the job's one writer (sinks/jsonl.py)
OUTPUT_FILES = (ROLLOUTS, FAILURES, METRICS)  # what a finished job hands its user
SERVICES_LOG = "services.log"


def job_dir(output_dir: str | os.PathLike[str], job_id: str) -> Path:
    """Where a job's files live: <output_dir>/<job_id>/."""
    return Path(output_dir) / job_id


def is_job_id(job_id: str) -> bool:
    """A job id names one folder under the results root (no separators, not . or ..)."""
    return bool(job_id) and "/" not in job_id and os.sep not in job_id and job_id not in (".", "..")


# ---- JSON files (job.json, metrics.json) -------------------------------------------------------


def write_json_atomic(path: Path, data: Json) -> None:
    """Write `data` as JSON so a crash leaves the old file or the new one, never half of one.
    On any error (ENOSPC, EIO) the temporary file is removed and the error raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_json(path: Path) -> Json | None:
    """A JSON object file, or None when absent or unreadable."""
    try:
        data = untrusted_json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError):  # NotJson, UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None


# ---- JSONL files: repair, read complete rows, follow a growing file ---------------------------


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
        pos, keep, block = size, 0, 64 * 1024  # scan back in blocks for the last newline
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


def iter_rows(
    path: Path, skipped: list[str] | None = None, *, upto: int | None = None
) -> Iterator[tuple[int, Json]]:
    """(line number, row) for every non-blank line (of the first `upto` bytes when given: a line
    boundary); a malformed complete line raises CorruptSinkFile, an unparsed last line without its
    newline (module doc) is skipped, its `file:line` added to `skipped`."""
    read = 0
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if upto is not None and read >= upto:
                return
            read += len(raw)
            if not raw.strip():
                continue
            try:
                row = _row(raw)
            except NotJson as exc:
                if not raw.endswith(b"\n"):
                    log.debug("sink_partial_last_line_skipped", file=str(path), line=lineno)
                    if skipped is not None:
                        skipped.append(f"{path}:{lineno}")
                    return
                raise CorruptSinkFile(f"{path}:{lineno}: {exc}") from None
            yield lineno, row


def _row(raw: bytes) -> Json:
    """One JSONL line as a JSON object; NotJson saying why not."""
    try:
        # Decoded as UTF-8 here: json.loads(bytes) guesses UTF-16/32 from the first bytes and
        # failed with a codec error naming neither the file nor the line.
        row = untrusted_json.loads(raw.decode("utf-8"))
    except (NotJson, UnicodeDecodeError) as exc:
        said = str(exc) if isinstance(exc, NotJson) else "not UTF-8 text"
        raise NotJson(f"not valid JSON ({said})") from None
    if not isinstance(row, dict):
        raise NotJson("not a JSON object")
    return row


def _rows_if_any(path: Path, upto: int | None = None) -> Iterator[tuple[int, Json]]:
    """`iter_rows` of a job's file that may not exist yet (then no rows)."""
    return iter_rows(path, upto=upto) if path.exists() else iter(())


def read_keys(path: Path) -> set[RolloutKey]:
    """The keys of every row of a rollouts or failures file (absent file: none)."""
    keys: set[RolloutKey] = set()
    for lineno, row in _rows_if_any(path):
        try:
            keys.add(RolloutKey(int(row["task_index"]), int(row["rollout_index"])))
        except (KeyError, TypeError, ValueError, OverflowError):
            raise CorruptSinkFile(f"{path}:{lineno}: row has no task_index/rollout_index") from None
    return keys


def changed_tasks(path: Path, rows: Sequence[Json], limit: int = 5) -> list[int]:
    """The lowest task indices (up to `limit`) whose stored rollouts echo another task than `rows` holds at
    that index (the dataset file was edited, reordered or replaced under the same path): resuming
    would pair those rollouts with other tasks. Reads the rollouts file; blocking."""
    changed: list[int] = []
    checked: set[int] = set()
    for lineno, row in _rows_if_any(path):
        stored = _parse(f"{path}:{lineno}", row, Rollout.from_row)
        index = stored.key.task_index
        if index in checked:
            continue
        checked.add(index)
        current = rows[index] if 0 <= index < len(rows) else None
        # both sides as the row echoes them: the task's fields but those rollmesh adds
        echoed = (
            None
            if current is None
            else Rollout.from_row({**current, "task_index": index, "rollout_index": 0})
        )
        if echoed is None or stored.task != echoed.task:
            changed.append(index)
    return sorted(changed)[:limit]


def read_lines(path: Path, byte_offset: int, limit: int, parse: Callable[[Json], T]) -> tuple[list[T], int]:
    """Up to `limit` complete rows of a growing file from `byte_offset`, each through `parse`; the rows
    and the offset after. A line that does not parse raises CorruptSinkFile naming its byte offset."""
    rows: list[T] = []
    if not path.exists():
        return rows, byte_offset
    with path.open("rb") as f:
        f.seek(byte_offset)
        while len(rows) < limit:
            line = f.readline()
            if not line.endswith(b"\n"):  # absent or torn: not written yet
                break
            if line.strip():
                where = f"{path} at byte {byte_offset}"
                try:
                    rows.append(_parse(where, _row(line), parse))
                except NotJson as exc:
                    raise CorruptSinkFile(f"{where}: {exc}") from None
            byte_offset += len(line)
    return rows, byte_offset


def skip_lines(path: Path, n: int, byte_offset: int = 0) -> tuple[int, int]:
    """Byte offset after the next `n` complete non-blank lines from `byte_offset`, and how many."""
    if n <= 0 or not path.exists():
        return byte_offset, 0
    skipped, pos = 0, byte_offset
    with path.open("rb") as f:
        f.seek(byte_offset)
        while skipped < n:
            line = f.readline()
            if not line.endswith(b"\n"):
                break
            pos += len(line)
            if line.strip():
                skipped += 1
    return pos, skipped


# ---- what a job folder holds --------------------------------------------------------------------


@dataclass(frozen=True)
class OnDisk:
    """Rows a job folder holds now, keys counted once; a failure whose key has a rollout is not one."""

    rollouts: int = 0
    failures: int = 0
    reward_sum: float = 0.0  # over the measured rollouts (metrics.measured_reward)
    masked: int = 0  # rollouts whose verdict was masked: in `rollouts`, not in `reward_sum`

    @property
    def done(self) -> int:
        return self.rollouts + self.failures


def count_on_disk(directory: Path) -> OnDisk:
    """Count the rows of a job folder (blocking; call from a thread)."""
    keys: set[RolloutKey] = set()
    reward, masked = 0.0, 0
    for _, row in _rows_if_any(directory / ROLLOUTS):
        key = RolloutKey(int(row["task_index"]), int(row["rollout_index"]))
        if key not in keys:
            keys.add(key)
            if row_masked(row):  # as metrics.measured_reward: in no reward figure
                masked += 1
            else:
                reward += float(row.get("reward", 0.0) or 0.0)
    failed = read_keys(directory / FAILURES) - keys
    return OnDisk(len(keys), len(failed), reward, masked)


def files_stamp(directory: Path) -> tuple[int, ...]:
    """(size, mtime_ns) of rollouts.jsonl and failures.jsonl: changes whenever a row is appended."""
    stamp: list[int] = []
    for name in (ROLLOUTS, FAILURES):
        try:
            st = (directory / name).stat()
            stamp += [st.st_size, st.st_mtime_ns]
        except OSError:
            stamp += [-1, -1]
    return tuple(stamp)


def retire_failures(directory: Path) -> int:
    """Before a run retries a job's failures, move their rows to failures.retried.jsonl so
    failures.jsonl only holds failures that stand; returns the rows moved. A crash between the two
    steps leaves a row in both files: harmless, the history file is never read as the job's result."""
    path = directory / FAILURES
    if not path.exists() or path.stat().st_size == 0:
        return 0
    data = path.read_bytes()
    with (directory / FAILURES_RETRIED).open("ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    with path.open("r+b") as f:
        f.truncate(0)
        os.fsync(f.fileno())
    return data.count(b"\n")


# ---- the results root: stored jobs and the resume scan ------------------------------------------


def stored_jobs(output_dir: Path) -> Iterator[tuple[Path, Json]]:
    """(folder, job.json) of every job under a results root (unreadable job.json files skipped)."""
    if not output_dir.is_dir():
        return
    for job_file in output_dir.glob(f"*/{JOB}"):
        stored = read_json(job_file)
        if stored is not None:
            yield job_file.parent, stored


# The fields that decide which rollouts a job contains (not how fast or where they go).
IDENTITY_FIELDS = (
    "benchmark",
    "dataset",
    "environment",
    "model",
    "num_repeats",
    "starting_seed",
    "limit",
    "shard_index",
    "shard_count",
    "sampling",
    "max_steps",
    "replace_groups",  # which keys stand for a task (refill.py); its bound is a budget, not identity
)


def identity(spec: JobSpec) -> Json:
    data = spec.to_json()
    return {k: data[k] for k in IDENTITY_FIELDS}


def find_resumable(output_dir: Path, spec: JobSpec) -> str | None:
    """The id of the newest job under `output_dir` with the same rollouts (identity) as `spec`
    that did not succeed: what `rollmesh run --resume` finishes."""
    want = identity(spec)
    candidates: list[tuple[float, str]] = []
    for folder, stored in stored_jobs(output_dir):
        if stored.get("state") == "SUCCEEDED":
            continue
        try:
            same = identity(JobSpec.from_json(stored.get("spec") or {})) == want
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
        if same:
            created = float(stored.get("create_time") or 0.0)
            candidates.append((created, str(stored.get("job_id", folder.name))))
    return max(candidates)[1] if candidates else None


# ---- offline loading (aggregate, export, reverify) ----------------------------------------------


def load_scored(
    directory: Path, *, rollouts_upto: int | None = None
) -> tuple[list[Scored], list[RolloutFailure]]:
    """What metrics read of every rollout a job folder holds (of the first `rollouts_upto` bytes of
    rollouts.jsonl when given), and its failures (blocking; call from a thread). One row is parsed
    at a time and only its `Scored` summary kept, so memory follows the number of rows (a few
    hundred bytes each), not the size of rollouts.jsonl (whole conversations). A row that is not a
    rollout row raises CorruptSinkFile naming its file and line."""
    rollouts = [
        Scored.of(_parse(f"{directory / ROLLOUTS}:{n}", row, Rollout.from_row))
        for n, row in _rows_if_any(directory / ROLLOUTS, rollouts_upto)
    ]
    failures = [
        _parse(f"{directory / FAILURES}:{n}", row, RolloutFailure.from_row)
        for n, row in _rows_if_any(directory / FAILURES)
    ]
    return rollouts, failures


@dataclass
class LoadedResults:
    """Rows of one or more sink files (shards of one job), keys deduplicated (first file wins)."""

    rollouts: list[Rollout] = field(default_factory=list)
    failures: list[RolloutFailure] = field(default_factory=list)
    duplicates: int = 0
    files: list[Path] = field(default_factory=list)
    keys_by_folder: dict[Path, set[RolloutKey]] = field(default_factory=dict)  # rollouts and failures
    skipped: list[str] = field(default_factory=list)  # file:line of unfinished last lines (iter_rows)


def expand_paths(patterns: Sequence[str]) -> list[Path]:
    """Globs, files and job folders (-> their rollouts.jsonl and failures.jsonl), in order, once each.
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


def read_rollout_rows(path: Path, skipped: list[str] | None = None) -> list[tuple[int, Json]]:
    """(line number, row) of a rollouts file (rollmesh's or NeMo Gym's), each row checked to parse as
    a Rollout; a NeMo Gym row without a key gets one (`RowKeys`: `_ng_task_index`/`_ng_rollout_index`)."""
    rows: list[tuple[int, Json]] = []
    keys = RowKeys()
    for lineno, row in iter_rows(path, skipped):
        row = keys.fill(row)
        _parse(f"{path}:{lineno}", row, Rollout.from_row)
        rows.append((lineno, row))
    return rows


def load_files(paths: Sequence[Path]) -> LoadedResults:
    """Rollouts and failures of many files as one run (blocking; call from a thread). A key seen
    again in a row of the same job is a duplicate (counted, the first row kept); in a row of
    another job it raises MixedJobs: shards of one job never share a key."""
    res = LoadedResults(files=list(paths))
    seen: dict[RolloutKey, tuple[str, Path, int]] = {}
    for path in paths:
        held = res.keys_by_folder.setdefault(path.parent, set())
        if path.name.startswith("failures"):
            for lineno, row in iter_rows(path, res.skipped):
                failure = _parse(f"{path}:{lineno}", row, RolloutFailure.from_row)
                res.failures.append(failure)
                held.add(failure.key)
            continue
        keys = RowKeys()
        for lineno, row in iter_rows(path, res.skipped):
            r = _parse(f"{path}:{lineno}", keys.fill(row), Rollout.from_row)
            held.add(r.key)
            first = seen.get(r.key)
            if first is None:
                seen[r.key] = (r.job_id, path, lineno)
                res.rollouts.append(r)
                continue
            if first[0] != r.job_id:
                raise MixedJobs(
                    f"{first[1]}:{first[2]} (job {first[0]!r}) and {path}:{lineno} (job {r.job_id!r}) "
                    f"both hold rollout (task {r.key.task_index}, rollout {r.key.rollout_index}): "
                    "these are not shards of one job; aggregate one job's files at a time"
                )
            res.duplicates += 1
    return res


@dataclass(frozen=True)
class Incomplete:
    """A job whose folder was aggregated without all its rollouts: its job.json plans `total`
    rows, the files hold `rows` (rollouts and failures, keys once) and it ended `state`."""

    job_id: str
    folder: Path
    state: str
    rows: int
    total: int

    def describe(self) -> str:
        return (
            f"{self.job_id} ({self.folder}) is {self.state} with {self.rows} of its {self.total} rollouts: "
            f"the metrics leave out the {self.total - self.rows} it has not run; resume it "
            f"(rollmesh run --job-id {self.job_id} --output-dir {self.folder.parent}) and aggregate again"
        )


def incomplete_jobs(loaded: LoadedResults) -> list[Incomplete]:
    """The jobs among `loaded`'s folders (those with a job.json) that are not all there: their rows
    fall short of the planned total (a shard that failed, was cancelled or still runs). Metrics over
    them are not the job's; a folder without job.json cannot be checked."""
    out: list[Incomplete] = []
    for folder, held in loaded.keys_by_folder.items():
        stored = read_json(folder / JOB)
        if stored is None:
            continue
        job_id = str(stored.get("job_id") or folder.name)
        progress = stored.get("progress")
        try:
            total = int(progress.get("total") or 0) if isinstance(progress, dict) else 0
        except (TypeError, ValueError, OverflowError):  # OverflowError: a total of 1e400 (inf)
            continue
        if total and len(held) < total:
            out.append(Incomplete(job_id, folder, str(stored.get("state") or "?"), len(held), total))
    return out


def _parse(where: str, row: Json, parse: Callable[[Json], T]) -> T:
    try:
        return parse(row)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise CorruptSinkFile(
            f"{where}: not a rollout row of rollmesh or NeMo Gym ({type(exc).__name__}: {exc})"
        ) from None
