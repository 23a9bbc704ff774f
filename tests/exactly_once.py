"""The check every fault test ends with: a job's folder tells the truth, exactly once.

    truth = check_exactly_once(job_dir, expected_keys(150, 4), job=final_job)

Asserts, with a message naming the offending keys or files:
- every (task_index, rollout_index) key has at most one row across rollouts.jsonl and
  failures.jsonl (failures.jsonl holds the failures that stand; rows of failures a later run
  retried are kept in failures.retried.jsonl, which this check ignores);
- no key outside `expected` (when given); with `complete=True`, every expected key is present;
- no `*.tmp` file is left in the folder and job.json (when present) parses;
- when `job` (the scheduler's final answer, a `scheduler_pb2.Job`) is given and ended: job.json
  says the same state (or, for INTERRUPTED, that it was still running), its counts match the
  files (`succeeded + skipped_existing` rollouts, `failed` failures, this run's), a SUCCEEDED
  job is complete, and metrics.json (when present; an interrupted run wrote none) counts the
  same rows.

Reads rows with plain `json` (not the code under test); a torn last line without its newline is
ignored, as every reader of a live sink file does.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Key = tuple[int, int]

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "COMPLETED_WITH_FAILURES", "INTERRUPTED"}


@dataclass(frozen=True)
class FolderTruth:
    """What a job folder holds."""

    rollout_keys: frozenset[Key]
    failure_keys: frozenset[Key]
    job_file: dict[str, Any] | None
    metrics_file: dict[str, Any] | None

    @property
    def keys(self) -> frozenset[Key]:
        return self.rollout_keys | self.failure_keys


def expected_keys(num_tasks: int, num_repeats: int) -> set[Key]:
    """Every key of a job over tasks 0..num_tasks-1 with num_repeats rollouts each."""
    return {(t, i) for t in range(num_tasks) for i in range(num_repeats)}


def read_keys(path: Path) -> list[Key]:
    """Keys of every complete row of a JSONL file (absent file: none; a torn last line: ignored)."""
    if not path.exists():
        return []
    *complete, _torn_tail = path.read_bytes().split(b"\n")
    keys: list[Key] = []
    for lineno, raw in enumerate(complete, start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError:
            raise AssertionError(f"{path}:{lineno} is not JSON") from None
        keys.append((int(row["task_index"]), int(row["rollout_index"])))
    return keys


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    data = json.loads(path.read_text())  # a torn job.json or metrics.json fails the check here
    assert isinstance(data, dict), f"{path} is not a JSON object"
    return data


def _dups(keys: list[Key]) -> list[Key]:
    return sorted(k for k, n in Counter(keys).items() if n > 1)


def check_exactly_once(
    directory: Path,
    expected: Iterable[Key] | None = None,
    *,
    job: Any = None,
    complete: bool = True,
) -> FolderTruth:
    """Assert the folder's exactly-once truth (see the module docstring); returns what it holds."""
    directory = Path(directory)
    rollouts = read_keys(directory / "rollouts.jsonl")
    failures = read_keys(directory / "failures.jsonl")
    assert not _dups(rollouts), f"keys written twice to rollouts.jsonl: {_dups(rollouts)[:10]}"
    assert not _dups(failures), f"keys written twice to failures.jsonl: {_dups(failures)[:10]}"
    both = sorted(set(rollouts) & set(failures))
    assert not both, f"keys in both rollouts.jsonl and failures.jsonl: {both[:10]}"
    leftovers = sorted(p.name for p in directory.glob("*.tmp"))
    assert not leftovers, f"temporary files left in {directory}: {leftovers}"
    truth = FolderTruth(
        frozenset(rollouts),
        frozenset(failures),
        _read_json(directory / "job.json"),
        _read_json(directory / "metrics.json"),
    )
    if expected is not None:
        want = set(expected)
        extra = sorted(truth.keys - want)
        assert not extra, f"keys that are not part of the job: {extra[:10]}"
        missing = sorted(want - truth.keys)
        if complete:
            assert not missing, f"{len(missing)} keys have no row, e.g. {missing[:10]}"
    if job is not None:
        _check_reported(truth, job, expected)
    return truth


def _check_reported(truth: FolderTruth, job: Any, expected: Iterable[Key] | None) -> None:
    from rollmesh_client._scheduler import state_name

    state = state_name(job.state)
    if state not in FINAL:
        return  # a running job's counts include buffered rows; check it once it ended
    p = job.progress
    where = f"job {job.job_id} ({state}, progress {p.succeeded}+{p.skipped_existing} ok, {p.failed} failed)"
    if truth.job_file is not None:
        # INTERRUPTED is what a restarted scheduler calls a job whose job.json still says it runs.
        said = truth.job_file.get("state")
        agrees = said in ("PENDING", "RUNNING") if state == "INTERRUPTED" else said == state
        assert agrees, f"job.json says {said}, the scheduler says {state}"
    assert p.succeeded + p.skipped_existing == len(truth.rollout_keys), (
        f"{where}: rollouts.jsonl holds {len(truth.rollout_keys)} rows"
    )
    assert p.failed == len(truth.failure_keys), (
        f"{where}: failures.jsonl holds {len(truth.failure_keys)} rows"
    )
    if state == "SUCCEEDED" and expected is not None:
        assert truth.keys == set(expected), f"{where}: SUCCEEDED but keys are missing"
    if truth.metrics_file is not None and state != "INTERRUPTED":  # an interrupted run wrote none
        m = truth.metrics_file
        assert m.get("num_rollouts", 0) == len(truth.rollout_keys), (
            f"metrics.json counts {m.get('num_rollouts')} rollouts, the file holds {len(truth.rollout_keys)}"
        )
        assert m.get("num_failures", 0) == len(truth.failure_keys), (
            f"metrics.json counts {m.get('num_failures')} failures, the file holds {len(truth.failure_keys)}"
        )
