"""A sink that cannot write (ENOSPC, EIO) fails the job at once and never lies (issue 12.1).

The failed batch is cut back and not counted, job.json and metrics.json say what is on disk, no
`*.tmp` is left, no task exception goes unretrieved, and a resume afterwards completes exactly once.
Injected ENOSPC first (everywhere), then a real full filesystem: a small tmpfs (needs mount rights).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler import store
from rollmesh.scheduler.errors import SinkWriteFailed
from rollmesh.scheduler.job_convert import job_to_pb
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.manager import JobRecord
from rollmesh.scheduler.plan import Plan
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.sinks.jsonl import JsonlSink
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import SinkConfig
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


def rollout(t: int, i: int) -> Rollout:
    return Rollout(key=RolloutKey(t, i), job_id="job1", task={"q": t}, messages=[], reward=1.0)


class DiskWithRoom:
    """An `_append` that stores `room` more bytes, then writes what fits and raises ENOSPC."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.failures = 0

    def __call__(self, fd: int, data: bytes) -> None:
        fits = data[: max(self.room, 0)]
        if fits:
            os.write(fd, fits)
            self.room -= len(fits)
        if len(fits) < len(data):
            self.failures += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def rows_in(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes() if path.exists() else b""
    assert not data or data.endswith(b"\n"), f"{path} ends with a torn line"
    return [json.loads(x) for x in data.splitlines() if x.strip()]


async def test_a_failed_batch_is_cut_back_not_counted_and_breaks_the_sink(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync_every=2, flush_interval_s=0)
    reported: list[Exception] = []
    sink.on_error = reported.append
    await sink.open("job1", total=6, spec={"num_repeats": 2})
    await sink.write(rollout(0, 0))
    await sink.write(rollout(0, 1))  # batch 1: on disk
    first_batch = (tmp_path / store.ROLLOUTS).stat().st_size
    sink._append = DiskWithRoom(room=first_batch // 3)  # type: ignore[method-assign]
    await sink.write(rollout(1, 0))
    with pytest.raises(SinkWriteFailed) as info:
        await sink.write(rollout(1, 1))  # batch 2: a third of it fits, then ENOSPC
    assert (info.value.code, info.value.reason) == (grpc.StatusCode.INTERNAL, "SINK_WRITE_FAILED")
    assert "No space left on device" in info.value.message and "resume" in info.value.message
    assert len(reported) == 1  # the job manager hears it once
    assert [(r["task_index"], r["rollout_index"]) for r in rows_in(tmp_path / store.ROLLOUTS)] == [
        (0, 0),
        (0, 1),
    ]
    assert sink.rows_written == 2 and sink.keys == {RolloutKey(0, 0), RolloutKey(0, 1)}
    assert sink.not_stored() == {RolloutKey(1, 0), RolloutKey(1, 1)}  # metrics leave them out
    with pytest.raises(SinkWriteFailed):  # broken for good: nothing more is accepted
        await sink.write(rollout(2, 0))
    await sink.close(state="FAILED", metrics=None)  # the error is known: close reports what is on disk
    assert json.loads((tmp_path / store.METRICS).read_text())["num_rollouts"] == 2
    assert len(reported) == 1

    again = JsonlSink(tmp_path, fsync_every=2, flush_interval_s=0)  # resume once there is room
    assert await again.open("job1", total=6, spec={"num_repeats": 2}) == {RolloutKey(0, 0), RolloutKey(0, 1)}
    for t, i in [(1, 0), (1, 1), (2, 0), (2, 1)]:
        await again.write(rollout(t, i))
    await again.close(state="SUCCEEDED", metrics=None)
    check_exactly_once(tmp_path, expected_keys(3, 2))


def test_write_json_atomic_leaves_the_old_file_and_no_tmp_on_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / store.JOB
    store.write_json_atomic(path, {"state": "RUNNING"})

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store.os, "fsync", no_space)
    with pytest.raises(OSError):
        store.write_json_atomic(path, {"state": "FAILED"})
    assert json.loads(path.read_text()) == {"state": "RUNNING"} and not list(tmp_path.glob("*.tmp"))


class UnretrievedTaskErrors:
    """Collects the loop's 'Task exception was never retrieved' reports."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def __enter__(self) -> UnretrievedTaskErrors:
        loop = asyncio.get_running_loop()
        self._old = loop.get_exception_handler()
        loop.set_exception_handler(lambda _loop, ctx: self.messages.append(str(ctx.get("message"))))
        return self

    def __exit__(self, *exc: object) -> None:
        gc.collect()  # unretrieved task exceptions are reported when the task is collected
        asyncio.get_running_loop().set_exception_handler(self._old)


async def _manager(tmp_path: Path, disk: DiskWithRoom | None) -> tuple[JobManager, LocalModel]:
    def sink_factory(job_id: str, plan: Plan, directory: Path) -> JsonlSink:
        sink = JsonlSink(directory, fsync_every=4, flush_interval_s=0.05)
        if disk is not None:
            sink._append = disk  # type: ignore[method-assign]
        return sink

    model = LocalModel(latency_s=0.002)
    mgr = JobManager(
        CATALOG, model=model, env=LocalEnv(), output_dir=str(tmp_path), sink_factory=sink_factory
    )
    return mgr, model


def _check(rec: JobRecord, expected: set[tuple[int, int]], *, complete: bool) -> None:
    check_exactly_once(rec.directory, expected, job=job_to_pb(rec, time.time()), complete=complete)


async def test_disk_full_fails_the_job_at_once_and_resume_completes_exactly_once(tmp_path: Path) -> None:
    data = Rows.arithmetic(60).write(tmp_path / "d.jsonl")
    spec = JobSpec(
        dataset=str(data), environment="arithmetic", num_repeats=4, concurrency=8, output_dir=str(tmp_path)
    )
    expected = expected_keys(60, 4)
    disk = DiskWithRoom(room=20_000)  # room for a few dozen of the 240 rows
    mgr, model = await _manager(tmp_path, disk)
    with UnretrievedTaskErrors() as unretrieved:
        try:
            rec = await mgr.wait((await mgr.submit(spec)).job_id)
        finally:
            await mgr.aclose()
    assert rec.state == "FAILED" and "No space left on device" in rec.error, rec.error
    assert disk.failures == 1  # the first ENOSPC stopped everything: no later batch was tried
    assert len(model.calls) < 240 / 2, "the job kept calling the model after the disk filled"
    assert unretrieved.messages == []
    stored = json.loads((rec.directory / store.JOB).read_text())
    assert stored["state"] == "FAILED" and stored["progress"]["succeeded"] == rec.progress.succeeded
    _check(rec, expected, complete=False)  # counts match the rows on disk; no phantom rows

    mgr2, _ = await _manager(tmp_path, None)  # space is back: resume by id
    try:
        resumed = await mgr2.wait(
            (await mgr2.submit(JobSpec(resume_job_id=rec.job_id, output_dir=str(tmp_path)))).job_id
        )
    finally:
        await mgr2.aclose()
    assert resumed.state == "SUCCEEDED", resumed.error
    assert resumed.progress.skipped_existing == rec.progress.succeeded
    _check(resumed, expected, complete=True)


async def test_metrics_count_what_the_sink_stored_when_the_disk_fills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that filled mid-job: job.json said the rows on disk, but GetJobMetrics (and so
    `rollmesh run --json`) counted the rows handed to the sink too (1,663 vs 1,600 on disk), the
    ones its failed batch never stored. metrics.json cannot be written either (the disk is full)."""
    real = store.write_json_atomic

    def full_for_metrics(path: Path, data: Any) -> None:
        if path.name == store.METRICS:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(store, "write_json_atomic", full_for_metrics)
    data = Rows.arithmetic(60).write(tmp_path / "d.jsonl")
    spec = JobSpec(
        dataset=str(data), environment="arithmetic", num_repeats=4, concurrency=8, output_dir=str(tmp_path)
    )
    mgr, _ = await _manager(tmp_path, DiskWithRoom(room=20_000))
    try:
        rec = await mgr.wait((await mgr.submit(spec)).job_id)
        on_disk = len(rows_in(rec.directory / store.ROLLOUTS))
        assert rec.state == "FAILED" and 0 < on_disk < 240 and not (rec.directory / store.METRICS).exists()
        assert rec.progress.succeeded == on_disk
        for from_file in (True, False):  # GetJobMetrics, and its recount of a corrupt metrics.json
            got = await mgr.metrics(rec.job_id, from_file=from_file)
            assert got["num_rollouts"] == on_disk, (from_file, got["num_rollouts"], on_disk)
    finally:
        await mgr.aclose()


class PartlyAcknowledged(MemorySink):
    """A consumer that acknowledges its first `acks` rollouts and never the rest."""

    def __init__(self, acks: int) -> None:
        super().__init__()
        self.acks = acks

    def not_stored(self) -> frozenset[RolloutKey]:
        return frozenset(r.key for r in self.rollouts[self.acks :])


async def test_metrics_of_a_sink_without_a_file_count_what_it_acknowledged(tmp_path: Path) -> None:
    """The metrics a trainer gets in SinkClose and GetJobMetrics cover acknowledged rollouts only."""
    data = Rows.arithmetic(10).write(tmp_path / "d.jsonl")
    sink = PartlyAcknowledged(acks=15)
    mgr = JobManager(
        CATALOG, model=LocalModel(), env=LocalEnv(), output_dir=str(tmp_path), sink_factory=lambda *a: sink
    )
    spec = JobSpec(dataset=str(data), environment="arithmetic", num_repeats=4, output_dir=str(tmp_path))
    try:
        rec = await mgr.wait(
            (await mgr.submit(replace(spec, sink=SinkConfig(kind="grpc", address="127.0.0.1:9")))).job_id
        )
        assert len(sink.rollouts) == 40 and sink.metrics is not None
        assert sink.metrics["num_rollouts"] == 15
        assert (await mgr.metrics(rec.job_id))["num_rollouts"] == 15
    finally:
        await mgr.aclose()


# ---- a real full filesystem --------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_a_real_full_tmpfs_fails_the_job_then_resume_completes(
    tmp_path: Path, small_tmpfs: Path
) -> None:
    data = Rows.arithmetic(100).write(tmp_path / "d.jsonl")
    runs = small_tmpfs / "runs"
    spec = JobSpec(
        dataset=str(data), environment="arithmetic", num_repeats=4, concurrency=8, output_dir=str(runs)
    )
    expected = expected_keys(100, 4)
    ballast = small_tmpfs / "ballast"
    free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
    ballast.write_bytes(b"\0" * (free - 160 * 1024))  # ~160 KiB left: ~1.5 sink batches of 64 rows of ~1.7 KB

    mgr = JobManager(CATALOG, model=LocalModel(latency_s=0.002), env=LocalEnv(), output_dir=str(runs))
    with UnretrievedTaskErrors() as unretrieved:
        try:
            rec = await mgr.wait((await mgr.submit(spec)).job_id)
        finally:
            await mgr.aclose()
    assert rec.state == "FAILED" and "No space left on device" in rec.error, rec.error
    assert unretrieved.messages == []
    _check(rec, expected, complete=False)
    assert 0 < rec.progress.succeeded < 400

    ballast.unlink()  # space is back
    mgr2 = JobManager(CATALOG, model=LocalModel(), env=LocalEnv(), output_dir=str(runs))
    try:
        resumed = await mgr2.wait(
            (await mgr2.submit(JobSpec(resume_job_id=rec.job_id, output_dir=str(runs)))).job_id
        )
    finally:
        await mgr2.aclose()
    assert resumed.state == "SUCCEEDED", resumed.error
    _check(resumed, expected, complete=True)


async def test_an_output_dir_that_is_a_file_is_a_one_line_refusal_not_internal(tmp_path: Path) -> None:
    """`rollmesh run -o FILE` answered INTERNAL ('internal error; see the server log', exit 1)."""
    from rollmesh.mesh.errors import RollmeshError

    path = Rows.arithmetic(2).write(tmp_path / "d.jsonl")
    (a_file := tmp_path / "afile").write_text("")
    mgr = JobManager(CATALOG, model=LocalModel(), env=LocalEnv(), output_dir=str(tmp_path))
    try:
        with pytest.raises(RollmeshError) as info:
            await mgr.submit(JobSpec(dataset=str(path), environment="arithmetic", output_dir=str(a_file)))
        assert (info.value.code, info.value.reason) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "OUTPUT_DIR_UNUSABLE",
        )
        assert f"cannot write the job folder {a_file}/job-" in info.value.message
        assert "Not a directory" in info.value.message, info.value.message
        assert await mgr.list_jobs() == []  # no phantom job left behind
    finally:
        await mgr.aclose()
