"""Honest job outcomes: the final state from permanent failures and the user's bound, the failure
summary, fail fast on a repeated non-retryable error, and the CLI's exit codes."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import typer

from rollmesh.commands._exit import exit_code_for
from rollmesh.commands._jobs import parse_allowed_failures
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.outcome import FailFast
from rollmesh.scheduler.outcome import FailureTally
from rollmesh.scheduler.outcome import failure_bound
from rollmesh.scheduler.outcome import final_state
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh_client import InvalidArgumentError
from rollmesh_client import NotFoundError
from rollmesh_client import UnauthenticatedError
from rollmesh_client import UnavailableError
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


async def _no_sleep(_: float) -> None:
    return None


def _job(tmp_path: Path, model: LocalModel, rows: int = 10, **kw: object) -> tuple[JobRun, MemorySink]:
    path = Rows.arithmetic(rows).write(tmp_path / "d.jsonl")
    spec = JobSpec(dataset=str(path), environment="arithmetic", **kw)  # type: ignore[arg-type]
    sink = MemorySink()
    run = JobRun(
        "job-o", build_plan(CATALOG, spec), sink, model=model, env=LocalEnv(), hooks=Hooks(sleep=_no_sleep)
    )
    return run, sink


def _rejecting(n: int) -> list[BaseException]:
    return [
        InvalidArgumentError(f"prompt {i} too long", code=grpc.StatusCode.INVALID_ARGUMENT) for i in range(n)
    ]


def test_bound_is_the_larger_of_count_and_fraction() -> None:
    assert failure_bound(1000, 0, 0.0) == 0
    assert failure_bound(1000, 5, 0.0) == 5
    assert failure_bound(1000, 5, 0.01) == 10
    assert failure_bound(1000, 50, 0.01) == 50
    assert failure_bound(3, 0, 0.5) == 1  # floor: 1.5 -> 1


def test_final_state_and_summary() -> None:
    tally = FailureTally()
    for i in range(3):
        tally.add("UPSTREAM_HTTP_ERROR:500", f"upstream said 500 ({i})")
    tally.add("DEADLINE_EXCEEDED", "the rollout attempt timed out")
    summary = tally.summary()
    assert [(s.error_class, s.count) for s in summary] == [
        ("UPSTREAM_HTTP_ERROR:500", 3),
        ("DEADLINE_EXCEEDED", 1),
    ]
    assert summary[0].example_message == "upstream said 500 (0)"  # the first message is the example
    kw = {"total": 10, "allowed_fraction": 0.0, "tally": tally}
    assert final_state(succeeded=6, failed=4, allowed_failures=4, **kw) == ("SUCCEEDED", "")  # type: ignore[arg-type]
    state, error = final_state(succeeded=6, failed=4, allowed_failures=3, **kw)  # type: ignore[arg-type]
    assert state == "COMPLETED_WITH_FAILURES"
    assert error.startswith(
        "4 of 10 rollouts failed permanently (allowed: 3; raise it with --allowed-failures)"
    )
    assert 'UPSTREAM_HTTP_ERROR:500 x3 (e.g. "upstream said 500 (0)")' in error
    state, error = final_state(succeeded=0, failed=4, allowed_failures=0, **kw)  # type: ignore[arg-type]
    assert state == "FAILED" and error.startswith("every rollout failed (4 of 10)")


def test_top_classes_are_bounded_and_examples_cut() -> None:
    tally = FailureTally()
    for i in range(8):
        for _ in range(i + 1):
            tally.add(f"C{i}", "x" * 1000)
    summary = tally.summary()
    assert [s.error_class for s in summary] == ["C7", "C6", "C5", "C4", "C3"]
    assert all(len(s.example_message) == 300 for s in summary)


def test_fail_fast_counts_one_class_in_a_row() -> None:
    ff = FailFast(3)
    assert not ff.failure("UNAUTHENTICATED", False)
    assert not ff.failure("UNAUTHENTICATED", False)
    ff.success()  # a success starts over
    assert not ff.failure("UNAUTHENTICATED", False)
    assert not ff.failure("MODEL_NOT_FOUND", False)  # another class starts over
    assert not ff.failure("UNAVAILABLE", True)  # retries ran out on a transient error: starts over
    assert not ff.failure("MODEL_NOT_FOUND", False)
    assert not ff.failure("MODEL_NOT_FOUND", False)
    assert ff.failure("MODEL_NOT_FOUND", False)


async def test_failures_within_the_bound_succeed(tmp_path: Path) -> None:
    model = LocalModel()
    model.errors = _rejecting(2)
    run, sink = _job(tmp_path, model, allowed_failures=2, concurrency=1)
    result = await run.run(await run.open())
    assert result.state == "SUCCEEDED" and len(sink.failures) == 2 and len(sink.rollouts) == 8
    assert [(s.error_class, s.count) for s in run.tally.summary()] == [("INVALID_ARGUMENT", 2)]


async def test_a_fraction_bound_and_one_failure_too_many(tmp_path: Path) -> None:
    model = LocalModel()
    model.errors = _rejecting(3)
    run, _ = _job(tmp_path, model, allowed_failure_fraction=0.2, concurrency=1)  # 20% of 10 = 2
    result = await run.run(await run.open())
    assert (
        result.state == "COMPLETED_WITH_FAILURES"
        and "3 of 10 rollouts failed permanently (allowed: 2" in result.error
    )


async def test_the_same_non_retryable_error_fails_the_job_fast(tmp_path: Path) -> None:
    """Every call UNAUTHENTICATED: the job stops after `fail_fast_after` rollouts, not the dataset."""
    model = LocalModel()
    model.errors = [UnauthenticatedError("bad bearer token", code=grpc.StatusCode.UNAUTHENTICATED)] * 10_000
    run, sink = _job(tmp_path, model, rows=500, concurrency=4, retry=RetryPolicy(fail_fast_after=7))
    result = await run.run(await run.open())
    assert result.state == "FAILED"
    assert (
        "7 rollouts in a row failed with UNAUTHENTICATED" in result.error
        and "bad bearer token" in result.error
    )
    assert 7 <= len(sink.failures) <= 7 + 4  # at most the rollouts already in flight finish after the stop
    assert len(model.calls) < 20


async def test_fail_fast_default_is_twenty_and_keeps_the_reason(tmp_path: Path) -> None:
    model = LocalModel()
    model.errors = [
        NotFoundError("model 'gpt-9' not found", code=grpc.StatusCode.NOT_FOUND, reason="MODEL_NOT_FOUND")
    ] * 1000
    run, sink = _job(tmp_path, model, rows=200, concurrency=1)
    result = await run.run(await run.open())
    assert result.state == "FAILED" and "20 rollouts in a row failed with MODEL_NOT_FOUND" in result.error
    assert len(sink.failures) == 20


async def test_transient_errors_that_ran_out_do_not_fail_fast(tmp_path: Path) -> None:
    model = LocalModel()
    model.errors = [  # 3 rollouts x 2 attempts of an upstream 503
        UnavailableError(
            "upstream said 503",
            code=grpc.StatusCode.UNAVAILABLE,
            reason="UPSTREAM_HTTP_ERROR",
            metadata={"http_status": "503"},
        )
        for _ in range(6)
    ]
    retry = RetryPolicy(max_attempts=2, fail_fast_after=2)
    run, sink = _job(tmp_path, model, rows=10, concurrency=1, allowed_failures=3, retry=retry)
    result = await run.run(await run.open())
    assert result.state == "SUCCEEDED", result.error
    assert len(sink.failures) == 3 and len(sink.rollouts) == 7
    assert {(f.error_class, f.attempts) for f in sink.failures} == {("UPSTREAM_HTTP_ERROR:503", 2)}


async def test_job_json_keeps_state_and_summary_for_a_restarted_scheduler(tmp_path: Path) -> None:
    path = Rows.arithmetic(6).write(tmp_path / "d.jsonl")
    model = LocalModel()
    model.errors = _rejecting(2)
    mgr = JobManager(CATALOG, model=model, env=LocalEnv(), output_dir=str(tmp_path))
    try:
        rec = await mgr.submit(JobSpec(dataset=str(path), environment="arithmetic", concurrency=1))
        await mgr.wait(rec.job_id)
        assert rec.state == "COMPLETED_WITH_FAILURES"
        assert [(s.error_class, s.count) for s in rec.failure_summary] == [("INVALID_ARGUMENT", 2)]
    finally:
        await mgr.aclose()
    other = JobManager(CATALOG, model=LocalModel(), env=LocalEnv(), output_dir=str(tmp_path))
    again = await other.get(rec.job_id)
    assert again.state == "COMPLETED_WITH_FAILURES" and again.error == rec.error
    assert again.failure_summary == rec.failure_summary
    assert again.failure_summary[0].example_message == "prompt 0 too long"


def test_exit_codes_tell_outcomes_apart() -> None:
    codes = {
        s: exit_code_for(s)
        for s in ("SUCCEEDED", "COMPLETED_WITH_FAILURES", "FAILED", "CANCELLED", "INTERRUPTED", "?")
    }
    assert codes == {
        "SUCCEEDED": 0,
        "COMPLETED_WITH_FAILURES": 3,
        "FAILED": 4,
        "CANCELLED": 5,
        "INTERRUPTED": 6,
        "?": 1,
    }


def test_allowed_failures_flag() -> None:
    assert parse_allowed_failures("5") == (5, 0.0)
    assert parse_allowed_failures("2.5%") == (0, 0.025)
    for bad in ("-1", "x", "150%"):
        with pytest.raises(typer.BadParameter):
            parse_allowed_failures(bad)


def test_max_replacements_flag_says_its_own_name() -> None:
    assert parse_allowed_failures("25%", flag="--max-replacements") == (0, 0.25)
    with pytest.raises(typer.BadParameter, match="--max-replacements 'x'"):
        parse_allowed_failures("x", flag="--max-replacements")
