"""One writer per job folder: a second run of a job (a resume while the first run still goes, or
while its process hangs) is refused with JOB_FOLDER_IN_USE and writes nothing; the first run is
untouched, and once it has ended (or its process died) the job resumes. Two runs used to write
every remaining key twice, and both reported SUCCEEDED."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.errors import JobFolderInUse
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.sinks.jsonl import JsonlSink
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.store import JOB
from rollmesh.scheduler.store import METRICS
from rollmesh.scheduler.store import WRITER_LOCK
from rollmesh.scheduler.store import job_dir
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import Rows
from tests.unit.test_results_jsonl_sink import rollout

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


async def test_a_second_sink_on_a_folder_in_use_is_refused_and_touches_nothing(tmp_path: Path) -> None:
    d = job_dir(tmp_path, "job1")
    first = JsonlSink(d, flush_interval_s=0)
    await first.open("job1", total=4, spec={})
    await first.write(rollout(0, 0))
    await first.flush()
    before = {p.name: p.read_bytes() for p in d.iterdir()}

    second = JsonlSink(d, flush_interval_s=0)
    with pytest.raises(JobFolderInUse) as refused:
        await second.open("job1", total=4, spec={})
    assert f"pid {os.getpid()}" in refused.value.message and refused.value.reason == "JOB_FOLDER_IN_USE"
    await second.close(state="FAILED", metrics=None)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before  # no metrics.json, no truncation

    await first.write(rollout(0, 1))
    await first.close(state="SUCCEEDED", metrics=None)
    third = JsonlSink(d, flush_interval_s=0)  # the first run ended: the folder is free again
    assert await third.open("job1", total=4, spec={}) == {RolloutKey(0, 0), RolloutKey(0, 1)}
    await third.close(state="SUCCEEDED", metrics=None)


async def test_resuming_a_job_while_its_first_run_goes_fails_visibly_without_duplicates(
    tmp_path: Path,
) -> None:
    data = Rows.arithmetic(50).write(tmp_path / "d.jsonl")
    runs = str(tmp_path / "runs")
    first = JobManager(CATALOG, model=LocalModel(latency_s=0.02), env=LocalEnv(), output_dir=runs)
    second = JobManager(CATALOG, model=LocalModel(), env=LocalEnv(), output_dir=runs)
    try:
        spec = JobSpec(
            dataset=str(data), environment="arithmetic", num_repeats=2, concurrency=2, output_dir=runs
        )
        rec = await first.submit(spec)
        deadline = time.monotonic() + 60
        while rec.progress.done < 5:  # the first run is under way
            assert time.monotonic() < deadline, rec.progress
            await asyncio.sleep(0.02)
        again = await second.wait(
            (await second.submit(JobSpec(resume_job_id=rec.job_id, output_dir=runs))).job_id
        )
        assert again.state == "FAILED" and "is being written by pid" in again.error, again.error
        done = await first.wait(rec.job_id)
    finally:
        await first.aclose()
        await second.aclose()
    assert done.state == "SUCCEEDED", done.error
    check_exactly_once(done.directory, expected_keys(50, 2))
    assert json.loads((done.directory / JOB).read_text())["state"] == "SUCCEEDED"  # not the refused run's
    assert json.loads((done.directory / METRICS).read_text())["num_rollouts"] == 100


HOLD = (
    "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
    "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'pid holder'); print('held', flush=True); time.sleep(600)"
)


async def test_the_lock_goes_with_its_process(tmp_path: Path) -> None:
    """A writer killed mid-job (SIGKILL: no close) leaves no lock behind: the job resumes at once."""
    d = tmp_path / "job1"
    d.mkdir()
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLD, str(d / WRITER_LOCK), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert (await asyncio.wait_for(holder.stdout.readline(), 60)).strip() == b"held"
        with pytest.raises(JobFolderInUse, match="pid holder"):
            await JsonlSink(d, flush_interval_s=0).open("job1", total=1, spec={})
    finally:
        holder.send_signal(signal.SIGKILL)
        await asyncio.wait_for(holder.wait(), 60)
    deadline = time.monotonic() + 30
    while True:
        sink = JsonlSink(d, flush_interval_s=0)
        try:
            await sink.open("job1", total=1, spec={})
            break
        except JobFolderInUse:
            assert time.monotonic() < deadline, "the lock outlived its process"
            await asyncio.sleep(0.1)
    await sink.close(state="SUCCEEDED", metrics=None)
    assert (d / METRICS).exists()


async def test_a_filesystem_without_flock_runs_the_job_unguarded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some NFS/FUSE mounts refuse flock (ENOLCK, EOPNOTSUPP): the job still runs there (with a
    warning), rather than failing at open with an OSError."""
    import errno
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    d = job_dir(tmp_path, "job1")
    sink = JsonlSink(d, flush_interval_s=0)
    await sink.open("job1", total=1, spec={})
    await sink.write(rollout(0, 0))
    await sink.close(state="SUCCEEDED", metrics=None)
    assert (d / "rollouts.jsonl").read_text().count("\n") == 1
