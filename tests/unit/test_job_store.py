"""The job store (scheduler/store.py): the resume scan, counting a folder, atomic JSON, corrupt files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler import store
from rollmesh.scheduler.errors import CorruptJobFile
from rollmesh.scheduler.errors import CorruptSinkFile
from rollmesh.scheduler.job_convert import job_to_pb
from rollmesh.scheduler.job_convert import jobs_to_pb
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.spec import JobSpec
from tests.fakes import LocalEnv
from tests.fakes import LocalModel

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


def _job(root: Path, job_id: str, spec: JobSpec, state: str, created: float) -> Path:
    folder = store.job_dir(root, job_id)
    store.write_json_atomic(
        folder / store.JOB, {"job_id": job_id, "spec": spec.to_json(), "state": state, "create_time": created}
    )
    return folder


def test_find_resumable_takes_the_newest_unfinished_job_with_the_same_rollouts(tmp_path: Path) -> None:
    spec = JobSpec(dataset="d.jsonl", environment="arithmetic", num_repeats=4, starting_seed=7)
    _job(tmp_path, "old", spec, "FAILED", 1.0)
    _job(tmp_path, "new", replace(spec, concurrency=64, output_dir="/elsewhere"), "INTERRUPTED", 2.0)
    _job(tmp_path, "done", spec, "SUCCEEDED", 3.0)  # succeeded: nothing to resume
    _job(tmp_path, "other-seed", replace(spec, starting_seed=8), "RUNNING", 4.0)  # other rollouts
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / store.JOB).write_text("{not json")  # unreadable: skipped, not fatal
    assert store.find_resumable(tmp_path, spec) == "new"  # how fast or where is not identity
    assert store.find_resumable(tmp_path, replace(spec, num_repeats=8)) is None
    assert store.find_resumable(tmp_path / "absent", spec) is None


def test_count_on_disk_counts_each_key_once_and_a_failure_only_without_a_rollout(tmp_path: Path) -> None:
    rows = [{"task_index": 0, "rollout_index": i, "reward": 1.0} for i in range(3)]
    (tmp_path / store.ROLLOUTS).write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"task_in')
    failures = [{"task_index": 0, "rollout_index": 2}, {"task_index": 1, "rollout_index": 0}]
    (tmp_path / store.FAILURES).write_text("".join(json.dumps(r) + "\n" for r in failures))
    before = store.files_stamp(tmp_path)
    counted = store.count_on_disk(tmp_path)
    assert (counted.rollouts, counted.failures, counted.reward_sum, counted.done) == (3, 1, 3.0, 4)
    with (tmp_path / store.ROLLOUTS).open("a") as f:
        f.write('dex": 5, "rollout_index": 0}\n')  # the torn row completes: the stamp changes
    assert store.files_stamp(tmp_path) != before and store.count_on_disk(tmp_path).rollouts == 4


def test_retire_failures_moves_rows_to_the_history_file(tmp_path: Path) -> None:
    (tmp_path / store.FAILURES).write_text('{"task_index": 1, "rollout_index": 0}\n')
    assert store.retire_failures(tmp_path) == 1
    assert (tmp_path / store.FAILURES).read_text() == ""
    assert (tmp_path / store.FAILURES_RETRIED).read_text().count("\n") == 1
    assert store.retire_failures(tmp_path) == 0  # nothing left to move


def test_a_spec_stored_by_an_older_version_still_loads() -> None:
    """A job stored before a field was retired (retry.max_consecutive_unavailable) can be resumed
    and listed: keys this version does not know are left out, at every level."""
    stored = JobSpec(dataset="d.jsonl", environment="arithmetic").to_json()
    stored["retry"]["max_consecutive_unavailable"] = 50
    stored["sink"]["retired_option"] = 1
    stored["retired_top_level"] = True
    spec = JobSpec.from_json(stored)
    assert spec == JobSpec(dataset="d.jsonl", environment="arithmetic")


DEEP = "[" * 100_000 + "]" * 100_000  # json.loads raises RecursionError on it


def test_rows_nested_too_deeply_or_past_int_are_corrupt_rows_not_internal_errors(tmp_path: Path) -> None:
    """read_lines (StreamRollouts' reader) used plain json.loads: a deep line raised RecursionError;
    a task_index of 1e400 raised OverflowError past every reader (aggregate, resume, count)."""
    good = {"task_index": 0, "rollout_index": 0, "reward": 1.0}
    path = tmp_path / store.ROLLOUTS
    path.write_text(json.dumps(good) + "\n" + DEEP + "\n")
    with pytest.raises(CorruptSinkFile, match=r"at byte \d+: not valid JSON \(nested too deeply\)"):
        store.read_lines(path, 0, 10, Rollout.from_row)
    rows, end = store.read_lines(path, 0, 1, Rollout.from_row)  # the good row before it still reads
    assert [r.reward for r in rows] == [1.0] and end == len(json.dumps(good)) + 1
    path.write_text(json.dumps({**good, "task_index": 1e400}) + "\n")
    for read in (
        lambda: store.read_lines(path, 0, 10, Rollout.from_row),
        lambda: store.load_files([path]),
        lambda: store.read_keys(path),
        lambda: store.changed_tasks(path, [{}]),
    ):
        with pytest.raises(CorruptSinkFile, match=str(path)):
            read()
    (tmp_path / store.JOB).write_text('{"job_id": ' + DEEP + "}")
    assert store.read_json(tmp_path / store.JOB) is None  # unreadable, like a torn job.json


async def test_a_corrupt_job_json_is_left_out_of_the_listing_and_named_when_asked_for(tmp_path: Path) -> None:
    """One job.json with a progress count 'abc' (or a spec field of the wrong type, an infinite time)
    made ListJobs INTERNAL for every job of the results root."""
    spec = JobSpec(dataset="d.jsonl", environment="arithmetic")
    _job(tmp_path, "job-good", spec, "SUCCEEDED", 1.0)
    corrupt = {
        "job-progress": {"progress": {"total": "abc"}},
        "job-time": {"create_time": 1e400},
        "job-spec": {"spec": {**spec.to_json(), "num_repeats": "4"}},
        "job-retry": {"spec": {**spec.to_json(), "retry": {"rollout_timeout_s": float("nan")}}},
    }
    for job_id, fields in corrupt.items():
        stored = {"job_id": job_id, "spec": spec.to_json(), "state": "SUCCEEDED", **fields}
        (tmp_path / job_id).mkdir()
        (tmp_path / job_id / store.JOB).write_text(json.dumps(stored))
    mgr = JobManager(CATALOG, model=LocalModel(), env=LocalEnv(), output_dir=str(tmp_path))
    try:
        listed = await mgr.list_jobs()
        assert [r.job_id for r in listed] == ["job-good"]
        assert [job_to_pb(r, 0.0).progress.total for r in listed] == [0]
        # A number the dataclass takes but the proto cannot carry (int32): left out of the listing.
        _job(tmp_path, "job-wide", replace(spec, num_repeats=2**40), "SUCCEEDED", 2.0)
        assert [j.job_id for j in jobs_to_pb(await mgr.list_jobs(), 0.0)] == ["job-good"]
        for job_id in corrupt:
            with pytest.raises(CorruptJobFile, match=f"{tmp_path / job_id / store.JOB}: "):
                await mgr.get(job_id)
    finally:
        await mgr.aclose()
