"""`rollmesh aggregate` / `rollmesh profile`: shards aggregated equal the unsharded run; readable errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner
from typer.testing import Result

from rollmesh.cli import build_app
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.sinks.jsonl import JsonlSink
from rollmesh.scheduler.store import FAILURES
from rollmesh.scheduler.store import METRICS
from rollmesh.scheduler.store import ROLLOUTS

runner = CliRunner()


async def invoke(*args: str) -> Result:
    """The CLI runs its own event loop (asyncio.run), so async tests call it from a thread."""
    return await asyncio.to_thread(lambda: runner.invoke(build_app(), list(args)))


def make(t: int, i: int, job_id: str = "job1") -> Rollout:
    reward = 1.0 if (t * 7 + i * 3) % 5 < 2 else 0.0
    answer = "right" if reward else ("wrong" if i % 2 else "")
    return Rollout(
        key=RolloutKey(t, i),
        job_id=job_id,
        task={"id": f"task-{t}", "expected_answer": "right"},
        messages=[{"role": "assistant", "content": answer}],
        reward=reward,
        extracted_answer=answer,
        prompt_tokens=10 + t,
        completion_tokens=3 + i,
    )


FAILED = {RolloutKey(5, 3)}


async def write_run(directory: Path, tasks: list[int]) -> None:
    sink = JsonlSink(directory, fsync_every=5, flush_interval_s=0)
    await sink.open("job1", total=len(tasks) * 4, spec={"num_repeats": 4})
    for i in range(4):  # completion order differs from key order
        for t in reversed(tasks):
            if RolloutKey(t, i) in FAILED:
                await sink.write_failure(
                    RolloutFailure(RolloutKey(t, i), "job1", "DEADLINE_EXCEEDED", "slow", 3)
                )
            else:
                await sink.write(make(t, i))
    await sink.close(state="succeeded", metrics=None)


async def test_shards_aggregated_equal_the_unsharded_run(tmp_path: Path) -> None:
    await write_run(tmp_path / "full", list(range(6)))
    await write_run(tmp_path / "shard0", [0, 2, 4])
    await write_run(tmp_path / "shard1", [1, 3, 5])
    # A stray copy of one row in another shard's file is deduplicated, not double counted.
    with (tmp_path / "shard1" / ROLLOUTS).open("a") as f:
        f.write(json.dumps(make(0, 0).to_row()) + "\n")

    full = json.loads((tmp_path / "full" / METRICS).read_text())
    out = tmp_path / "agg.json"
    res = await invoke("aggregate", str(tmp_path / "shard*"), "--out", str(out))
    assert res.exit_code == 0, res.output
    agg = json.loads(out.read_text())
    assert agg.pop("num_duplicates") == 1
    full.pop("job_state")
    full.pop("num_duplicates")
    assert agg == full
    assert full["num_failures"] == 1 and full["num_tasks_at_k"]["4"] == 5  # task 5 has 3 rollouts
    # The same with explicit files and --json on stdout.
    files = [str(tmp_path / s / n) for s in ("shard1", "shard0") for n in (ROLLOUTS, FAILURES)]
    res = await invoke("aggregate", *files, "--k", "2", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["pass_at_k"] == {"2": full["pass_at_k"]["2"]} and data["num_rollouts"] == 23
    # The README's form: rollouts files only; their failures sidecars come along.
    res = await invoke("aggregate", str(tmp_path / "shard*" / ROLLOUTS), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["num_failures"] == 1


async def test_a_shard_that_did_not_finish_is_named_and_exits_3(tmp_path: Path) -> None:
    """A shard that FAILED half-way aggregated with exit 0 and metrics that read as the whole job's."""
    await write_run(tmp_path / "shard0", [0, 2, 4])  # 12 rows: complete
    await write_run(tmp_path / "shard1", [1, 3])  # 8 rows of the 12 its job planned
    for shard, total, state in (("shard0", 12, "SUCCEEDED"), ("shard1", 12, "FAILED")):
        job = {"job_id": "job1", "state": state, "progress": {"total": total}}
        (tmp_path / shard / "job.json").write_text(json.dumps(job))
    res = await invoke("aggregate", str(tmp_path / "shard*"), "--json")
    assert res.exit_code == 3, res.output
    assert json.loads(res.stdout)["num_rollouts"] == 20  # still printed
    said = " ".join(res.stderr.split())
    assert f"incomplete: job1 ({tmp_path / 'shard1'}) is FAILED with 8 of its 12 rollouts" in said, said
    assert "shard0" not in said
    res = await invoke("aggregate", str(tmp_path / "shard0"), "--json")
    assert res.exit_code == 0 and "incomplete" not in res.stderr, res.output


async def test_profile_writes_one_line_per_task(tmp_path: Path) -> None:
    await write_run(tmp_path / "full", list(range(6)))
    out = tmp_path / "profile.jsonl"
    res = await invoke("profile", str(tmp_path / "full"), "--out", str(out))
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == [f"task-{t}" for t in range(6)]
    rewards = [make(0, i).reward for i in range(4)]
    assert rows[0]["mean_reward"] == sum(rewards) / 4 and rows[0]["num_rollouts"] == 4
    assert rows[5]["num_rollouts"] == 3


async def test_rows_of_two_jobs_with_one_key_are_refused_not_mixed(tmp_path: Path) -> None:
    """Two runs over one dataset (another model, say) share every key: aggregating them as shards
    kept the first file's rows and counted the rest as duplicates, one set of metrics silently
    mixing two runs. It is a one-line error (exit 2) naming both rows."""
    await write_run(tmp_path / "run1", [0, 1])
    run2 = tmp_path / "run2"
    run2.mkdir()
    (run2 / ROLLOUTS).write_text(json.dumps(make(1, 0, job_id="job2").to_row()) + "\n")
    res = await invoke("aggregate", str(tmp_path / "run1"), str(run2))
    assert res.exit_code == 2, res.output
    assert "RESULTS_OF_DIFFERENT_JOBS" in res.stderr and "'job1'" in res.stderr and "'job2'" in res.stderr
    assert "task 1, rollout 0" in res.stderr
    res = await invoke("profile", str(run2))
    assert res.exit_code == 0, res.output


def test_readable_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(make(0, 0).to_row()) + "\n\n{oops\n")
    res = runner.invoke(build_app(), ["aggregate", str(bad)])
    assert res.exit_code == 2 and f"{bad}:3: not valid JSON" in res.stderr
    no_key = tmp_path / "nokey.jsonl"
    no_key.write_text('{"reward": 1}\n')
    res = runner.invoke(build_app(), ["profile", str(no_key)])
    assert res.exit_code == 2 and f"{no_key}:1: not a rollout row of rollmesh or NeMo Gym" in res.stderr
    # A BOM-like start made json guess UTF-16 and fail with a codec error naming no file or line.
    (utf16 := tmp_path / "utf16.jsonl").write_bytes(
        b"\xff\xfe\n" + json.dumps(make(0, 0).to_row()).encode() + b"\n"
    )
    res = runner.invoke(build_app(), ["aggregate", str(utf16)])
    assert res.exit_code == 2 and f"{utf16}:1: not valid JSON (not UTF-8 text)" in res.stderr, res.stderr
    (deep := tmp_path / "deep.jsonl").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    res = runner.invoke(build_app(), ["aggregate", str(deep)])
    assert res.exit_code == 2 and f"{deep}:1: not valid JSON (nested too deeply)" in res.stderr, res.stderr
    for odd in (True, "1.0"):  # were counted as a reward of 1.0
        (edited := tmp_path / "edited.jsonl").write_text(
            json.dumps({**make(0, 0).to_row(), "reward": odd}) + "\n"
        )
        res = runner.invoke(build_app(), ["aggregate", str(edited)])
        assert res.exit_code == 2 and "reward is " in res.stderr and "not a number" in res.stderr, res.stderr
    res = runner.invoke(build_app(), ["aggregate", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "no such file" in res.stderr
    res = runner.invoke(build_app(), ["aggregate", str(tmp_path / "nothing*")])
    assert res.exit_code == 2 and "the glob matched nothing" in res.stderr


def test_nothing_to_read_is_an_error_and_a_cut_last_line_is_named(tmp_path: Path) -> None:
    """An empty results file aggregated to all-zero metrics with exit 0; a last line cut off
    mid-row was left out without a word."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    for command in (["aggregate"], ["profile"], ["validate"], ["reverify", "-e", "arithmetic"]):
        res = runner.invoke(build_app(), [*command, str(empty)])  # refused before reverify connects
        said = " ".join(res.stderr.split())
        assert res.exit_code == 2 and f"nothing to {command[0]}: no rollout rows in {empty}" in said, said
    only_failures = tmp_path / FAILURES
    only_failures.write_text(
        json.dumps(RolloutFailure(RolloutKey(0, 0), "job1", "X", "x", 1).to_row()) + "\n"
    )
    res = runner.invoke(build_app(), ["aggregate", str(only_failures)])
    assert res.exit_code == 2 and "(only 1 failure rows)" in res.stderr, res.stderr
    cut = tmp_path / "cut.jsonl"
    cut.write_text(
        "".join(json.dumps(make(0, i).to_row()) + "\n" for i in range(2)) + '{"task_index": 0, "rol'
    )
    res = runner.invoke(build_app(), ["aggregate", str(cut), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["num_rollouts"] == 2, res.output
    assert f"skipped 1 unfinished last line(s) (a row still being written, or cut off): {cut}:3" in " ".join(
        res.stderr.split()
    )


def test_a_folder_without_a_tokenizer_is_one_line(tmp_path: Path) -> None:
    """transformers' several-line message was printed as the error."""
    rows = tmp_path / ROLLOUTS
    rows.write_text(json.dumps(make(0, 0).to_row()) + "\n")
    (empty := tmp_path / "no_tokenizer").mkdir()
    res = runner.invoke(build_app(), ["validate", str(rows), "--tokenizer", str(empty)])
    said = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(said) == 1, res.stderr
    assert f"error: --tokenizer {empty}: no tokenizer there (" in said[0], said


async def test_bad_k_threshold_or_out_are_refused_not_silently_empty(tmp_path: Path) -> None:
    """`--k 0`, `--num-repeats -3` and `--threshold nan` printed metrics with exit 0 (no pass@k at
    all; NaN scored every rollout wrong); `profile -o` into a missing folder was a traceback."""
    await write_run(tmp_path / "full", list(range(6)))
    folder = str(tmp_path / "full")
    for args, flag in (
        (["--k", "0"], "--k"),
        (["--num-repeats", "-3"], "--num-repeats"),
        (["--threshold", "nan"], "--threshold"),
    ):
        res = await invoke("aggregate", folder, *args)
        assert res.exit_code == 2 and f"Invalid value for '{flag}'" in res.output, (args, res.output)
    res = await invoke("aggregate", folder, "--k", "9", "--k", "2", "--json")
    assert res.exit_code == 0 and set(json.loads(res.stdout)["pass_at_k"]) == {"2"}, res.output
    assert "no task has 9 rollouts: pass@9 and maj@9 are left out" in res.stderr
    res = await invoke("profile", folder, "-o", str(tmp_path / "missing" / "p.jsonl"))
    assert res.exit_code == 2 and "No such file or directory" in res.stderr and "Traceback" not in res.output


async def test_a_job_json_with_an_unreadable_total_is_not_checked(tmp_path: Path) -> None:
    """A total of 1e400 (inf) in job.json was an OverflowError traceback."""
    await write_run(tmp_path / "full", list(range(6)))
    for total in ('"abc"', "1e400", "-1"):
        (tmp_path / "full" / "job.json").write_text(
            '{"job_id": "job1", "progress": {"total": ' + total + "}}"
        )
        res = await invoke("aggregate", str(tmp_path / "full"), "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)["num_rollouts"] == 23, (total, res.output)


def test_every_reading_command_answers_a_hostile_file_in_one_line(tmp_path: Path) -> None:
    """health, timing, aggregate and profile on what a results file should not hold: one `error:`
    line naming the file (and the line, when there is one), exit 2, never a traceback."""
    good = json.dumps(make(0, 0).to_row()).encode() + b"\n"
    files = {
        "huge.jsonl": (b'{"a": "' + b"x" * 50_000_000 + b'"}\n', ":1: not a rollout row of rollmesh"),
        "latin1.jsonl": (good + b'{"task_index": 1, "x": "\xff\xfe"}\n', ":2: not valid JSON (not UTF-8"),
        "string.jsonl": (good + b'"a string"\n', ":2: not a JSON object"),
        "empty.jsonl": (b"", "no rollout rows in "),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "folder").mkdir()
    cases = [(tmp_path / name, needle) for name, (_, needle) in files.items()]
    cases += [(tmp_path / "missing.jsonl", ": no such file"), (tmp_path / "folder", "no rollout files in ")]
    for command in ("health", "timing", "aggregate", "profile"):
        for path, needle in cases:
            res = runner.invoke(build_app(), [command, str(path)])
            said = " ".join(res.stderr.split())
            assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (command, path, res.output)
            assert said.count("error:") == 1 and str(path) in said and needle in said, (command, said)
            assert "Traceback" not in res.output, (command, path)
