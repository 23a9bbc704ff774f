"""JSONL sink: fsync batching, exactly-once keys, torn-tail repair, resume keys, failures retried."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from rollmesh.scheduler.errors import CorruptSinkFile
from rollmesh.scheduler.errors import DuplicateRollout
from rollmesh.scheduler.errors import SinkClosed
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.sinks.jsonl import JsonlSink
from rollmesh.scheduler.store import FAILURES
from rollmesh.scheduler.store import FAILURES_RETRIED
from rollmesh.scheduler.store import METRICS
from rollmesh.scheduler.store import ROLLOUTS
from rollmesh.scheduler.store import job_dir
from rollmesh.scheduler.store import load_scored
from rollmesh.scheduler.store import repair_torn_tail
from rollmesh.scheduler.timing import RolloutTiming
from tests.exactly_once import check_exactly_once


def rollout(t: int, i: int, reward: float = 1.0) -> Rollout:
    return Rollout(
        key=RolloutKey(t, i),
        job_id="job1",
        task={
            "responses_create_params": {"input": [{"role": "user", "content": f"q{t}"}]},
            "expected_answer": "4",
        },
        messages=[{"role": "assistant", "content": "4"}],
        reward=reward,
        extracted_answer="4",
        tokens=TokenRecord([1, 2, 3], [0, 0, 1], [0.0, 0.0, -0.5], [TurnSpan(0, 2, 3, "0", "r0")]),
        completion_tokens=1,
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


async def test_fsync_batching_and_close_writes_metrics(tmp_path: Path) -> None:
    d = job_dir(tmp_path, "job1")
    sink = JsonlSink(d, fsync_every=3, flush_interval_s=0)
    assert await sink.open("job1", total=7, spec={"num_repeats": 7}) == set()
    for i in range(7):
        await sink.write(rollout(0, i, reward=float(i % 2)))
    assert sink.fsyncs == 2
    assert len(lines(d / ROLLOUTS)) == 6  # the 7th waits for its batch
    await sink.close(state="succeeded", metrics=None)
    assert sink.fsyncs == 3
    rows = [json.loads(x) for x in lines(d / ROLLOUTS)]
    assert [r["rollout_index"] for r in rows] == list(range(7))
    assert (
        rows[0]["expected_answer"] == "4"
        and rows[0]["responses_create_params"]["input"][0]["content"] == "q0"
    )
    assert Rollout.from_row(rows[3]) == rollout(0, 3, reward=1.0)
    metrics = json.loads((d / METRICS).read_text())
    assert metrics["job_state"] == "succeeded"
    assert metrics["num_rollouts"] == 7 and metrics["k_values"] == [1, 2, 4, 7]
    assert metrics["pass_at_1_avg"] == pytest.approx(3 / 7)
    with pytest.raises(SinkClosed):
        await sink.write(rollout(0, 9))


async def test_flush_interval_flushes_a_lone_row(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync_every=100, flush_interval_s=0.05)
    await sink.open("job1", total=1, spec={})
    await sink.write(rollout(0, 0))
    assert sink.fsyncs == 0
    await asyncio.wait_for(sink.flushed.wait(), timeout=5)  # no further write: the timer flushed it
    assert sink.fsyncs == 1
    assert len(lines(tmp_path / ROLLOUTS)) == 1
    await sink.close(state="succeeded", metrics=lambda: {"given": True})
    assert json.loads((tmp_path / METRICS).read_text()) == {"given": True, "job_state": "succeeded"}


async def test_a_key_is_written_exactly_once_across_runs(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync_every=2, flush_interval_s=0)
    await sink.open("job1", total=4, spec={})
    await sink.write(rollout(0, 0))
    with pytest.raises(DuplicateRollout) as info:
        await sink.write(rollout(0, 0))
    assert info.value.code == grpc.StatusCode.ALREADY_EXISTS and info.value.reason == "DUPLICATE_ROLLOUT"
    await sink.write(rollout(0, 1))
    await sink.write_failure(RolloutFailure(RolloutKey(1, 0), "job1", "UNAVAILABLE", "gateway down", 3))
    with pytest.raises(DuplicateRollout):
        await sink.write_failure(RolloutFailure(RolloutKey(1, 0), "job1", "UNAVAILABLE", "again", 3))
    await sink.close(state="failed", metrics=None)

    # Resume: the rollouts are held, the failure is not (a resume retries failures).
    again = JsonlSink(tmp_path, fsync_every=2, flush_interval_s=0)
    assert await again.open("job1", total=4, spec={}) == {RolloutKey(0, 0), RolloutKey(0, 1)}
    with pytest.raises(DuplicateRollout):
        await again.write(rollout(0, 1))
    await again.write(rollout(1, 0))  # the retried failure succeeds this time
    await again.close(state="succeeded", metrics=None)
    keys = [(r["task_index"], r["rollout_index"]) for r in map(json.loads, lines(tmp_path / ROLLOUTS))]
    assert keys == [(0, 0), (0, 1), (1, 0)]
    assert lines(tmp_path / FAILURES) == []  # failures.jsonl holds standing failures only
    assert len(lines(tmp_path / FAILURES_RETRIED)) == 1  # the retried one is kept as history
    check_exactly_once(tmp_path, {(0, 0), (0, 1), (1, 0)})
    metrics = json.loads((tmp_path / METRICS).read_text())
    assert metrics["num_failures"] == 0 and metrics["num_rollouts"] == 3


async def test_torn_tail_is_repaired_on_open(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync_every=1, flush_interval_s=0)
    await sink.open("job1", total=3, spec={})
    for i in range(3):
        await sink.write(rollout(0, i))
    await sink.close(state="running", metrics=lambda: {})
    intact = (tmp_path / ROLLOUTS).read_bytes()
    torn = json.dumps(rollout(0, 3).to_row()).encode()[:57]  # a crash mid-append
    with (tmp_path / ROLLOUTS).open("ab") as f:
        f.write(torn)
    with (tmp_path / FAILURES).open("ab") as f:
        f.write(b'{"task_index": 5, "rollout_in')

    resumed = JsonlSink(tmp_path, fsync_every=1, flush_interval_s=0)
    with capture_logs() as logs:
        keys = await resumed.open("job1", total=4, spec={})
    assert keys == {RolloutKey(0, i) for i in range(3)}
    assert (tmp_path / ROLLOUTS).read_bytes() == intact
    assert (tmp_path / FAILURES).read_bytes() == b""
    repaired = [e for e in logs if e["event"] == "sink_torn_tail_repaired"]
    assert {Path(e["file"]).name for e in repaired} == {ROLLOUTS, FAILURES}
    assert next(e for e in repaired if e["file"].endswith(ROLLOUTS))["bytes_removed"] == len(torn)
    await resumed.write(rollout(0, 3))  # the torn rollout is simply run again
    await resumed.close(state="succeeded", metrics=None)
    assert [json.loads(x)["rollout_index"] for x in lines(tmp_path / ROLLOUTS)] == [0, 1, 2, 3]


def test_repair_torn_tail_edge_cases(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"")
    assert repair_torn_tail(p) == 0
    p.write_bytes(b"no newline at all")
    assert repair_torn_tail(p) == 17 and p.read_bytes() == b""
    p.write_bytes(b'{"a":1}\n' + b"x" * 200_000)  # the scan crosses block boundaries
    assert repair_torn_tail(p) == 200_000 and p.read_bytes() == b'{"a":1}\n'
    assert repair_torn_tail(tmp_path / "missing.jsonl") == 0


async def test_a_corrupt_complete_line_is_an_error_with_its_line_number(tmp_path: Path) -> None:
    (tmp_path / ROLLOUTS).write_text(json.dumps(rollout(0, 0).to_row()) + "\nnot json\n")
    sink = JsonlSink(tmp_path, flush_interval_s=0)
    with pytest.raises(CorruptSinkFile) as info:
        await sink.open("job1", total=1, spec={})
    assert info.value.reason == "SINK_FILE_CORRUPT" and f"{ROLLOUTS}:2" in info.value.message


async def test_concurrent_writers_keep_every_row_once(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path, fsync_every=4, flush_interval_s=0)
    await sink.open("job1", total=40, spec={})
    await asyncio.gather(*(sink.write(rollout(t, i)) for t in range(10) for i in range(4)))
    await sink.close(state="succeeded", metrics=None)
    rows = [json.loads(x) for x in lines(tmp_path / ROLLOUTS)]
    assert len(rows) == 40 and len({(r["task_index"], r["rollout_index"]) for r in rows}) == 40
    assert 1 <= sink.fsyncs <= 10  # concurrent writers share batches (group commit), never more


def test_readers_skip_a_partial_last_line(tmp_path: Path) -> None:
    # A live file read while a batch is being appended (or a torn tail not yet repaired).
    full = json.dumps(rollout(0, 0).to_row())
    (tmp_path / ROLLOUTS).write_text(full + "\n" + full[:40])
    rollouts, failures = load_scored(tmp_path)
    assert [r.key for r in rollouts] == [RolloutKey(0, 0)] and failures == []


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        (ROLLOUTS, {"task_index": 0}),
        (ROLLOUTS, [1, 2]),
        (ROLLOUTS, {"task_index": 0, "rollout_index": 0, "reward": {}}),
        ("failures.jsonl", {"task_index": 0}),
        ("failures.jsonl", "a string"),
    ],
)
def test_metrics_name_a_stored_row_that_is_not_a_rollmesh_row(tmp_path: Path, name: str, bad: object) -> None:
    # GetJobMetrics counts a running job from its files: a hand-edited row answered INTERNAL (KeyError)
    good = json.dumps(rollout(0, 0).to_row())
    (tmp_path / name).write_text(
        f"{good}\n{json.dumps(bad)}\n" if name == ROLLOUTS else f"{json.dumps(bad)}\n"
    )
    with pytest.raises(CorruptSinkFile) as info:
        load_scored(tmp_path)
    assert f"{tmp_path / name}:{2 if name == ROLLOUTS else 1}" in str(info.value)


async def test_close_recomputes_metrics_without_holding_the_rows(tmp_path: Path) -> None:
    """metrics.json of a file-sink job is recomputed from the folder at close (earlier runs' rows
    count): only a small summary per row may stay in memory, never the conversations (a 100k-row job
    took the scheduler from 230 MB to 830 MB at close, for 35 s, when every row was loaded whole)."""
    d = job_dir(tmp_path, "job1")
    answer = "x" * 20_000  # a long conversation per row, as a real model writes
    rows, tasks, repeats = [], 100, 8
    for t in range(tasks):
        for i in range(repeats):
            r = rollout(t, i, reward=float((t + i) % 2))
            r.messages = [{"role": "assistant", "content": answer}]
            rows.append(json.dumps(r.to_row()) + "\n")
    d.mkdir(parents=True, exist_ok=True)
    (d / ROLLOUTS).write_text("".join(rows))  # the rows of an earlier run of the job
    del rows
    file_bytes = (d / ROLLOUTS).stat().st_size
    sink = JsonlSink(d, flush_interval_s=0)
    assert (
        len(await sink.open("job1", total=tasks * repeats, spec={"num_repeats": repeats})) == tasks * repeats
    )
    tracemalloc.start()
    try:
        await sink.close(state="succeeded", metrics=None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < file_bytes / 10, f"closing held {peak:,} bytes for a {file_bytes:,}-byte rollouts.jsonl"
    metrics = json.loads((d / METRICS).read_text())
    assert metrics["num_rollouts"] == tasks * repeats and metrics["mean_reward"] == 0.5


async def test_metrics_of_this_runs_rows_are_what_reading_the_folder_back_gives(tmp_path: Path) -> None:
    """A resumed run's metrics.json: the earlier run's rows are read back, this run's come from what
    the sink kept when writing them (they are not parsed again); both as the whole folder read back
    gives them, to the last digit: timings (rounded in the row), masked verdicts, health findings,
    a failure, a batch cut by fsync_every."""

    def varied(t: int, i: int) -> Rollout:
        r = rollout(t, i, reward=(t * 7 + i) % 5 / 4)
        r.masked = (t + i) % 6 == 0
        r.latency_s = 0.5 + t / 3 + i / 7
        # first_token_s's mean over the job is 0 from the rows as written (0 and 5.3e-7: 1e-6 in the
        # row), 1e-6 from these unrounded values: the row's rounding must be what counts.
        first = 0.0 if t < 3 else 5.3e-7
        r.timing = RolloutTiming(queued_s=t / 3, model_s=[i / 7, 1 / 3], first_token_s=[first])
        r.finish_reason = "length" if i % 3 == 0 else "stop"
        r.messages = [{"role": "assistant", "content": "" if i % 4 == 0 else f"{t} {i}"}]
        return r

    first = JsonlSink(tmp_path, fsync_every=3, flush_interval_s=0)
    await first.open("job1", total=24, spec={"num_repeats": 4})
    for t in range(3):
        for i in range(4):
            await first.write(varied(t, i))
    await first.close(state="failed", metrics=None)
    again = JsonlSink(tmp_path, fsync_every=5, flush_interval_s=0)
    await again.open("job1", total=24, spec={"num_repeats": 4})
    for t in range(3, 6):
        for i in range(4):
            await again.write(varied(t, i))
    await again.write_failure(RolloutFailure(RolloutKey(6, 0), "job1", "UNAVAILABLE", "gateway down", 3))
    await again.close(state="succeeded", metrics=None)

    written = json.loads((tmp_path / METRICS).read_text())
    rollouts, failures = load_scored(tmp_path)  # the whole folder, parsed
    assert len(rollouts) == 24 and len(failures) == 1
    read_back = compute(rollouts, failures, num_repeats=4, job_id="job1").to_json()
    assert written == {**read_back, "job_state": "succeeded"}
    assert written["num_masked"] > 0 and written["timing"]["first_token_s"]["mean"] == 1e-6
    assert written["health"], "no health finding to compare"


async def test_a_group_goes_into_one_batch_whole_or_not_at_all(tmp_path: Path) -> None:
    """write_group (a group-scored task's rows): all in one batch, never split at fsync_every; a group
    repeating a key (held, or twice in it) is refused whole, with nothing of it taken."""
    d = job_dir(tmp_path, "job1")
    sink = JsonlSink(d, fsync_every=2, flush_interval_s=0)
    await sink.open("job1", total=9, spec={"num_repeats": 3})
    await sink.write(rollout(0, 0))
    assert await sink.write_group([rollout(1, i) for i in range(3)]) == []
    assert sink.fsyncs == 1 and len(lines(d / ROLLOUTS)) == 4  # the write's row and the whole group
    for bad in ([rollout(2, 0), rollout(1, 2)], [rollout(2, 0), rollout(2, 0)]):
        with pytest.raises(DuplicateRollout):
            await sink.write_group(bad)
    assert await sink.write_group([rollout(2, i) for i in range(3)]) == []
    await sink.close(state="succeeded", metrics=None)
    keys = [(json.loads(x)["task_index"], json.loads(x)["rollout_index"]) for x in lines(d / ROLLOUTS)]
    assert keys == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
