"""Where each rollout's time went (scheduler/timing.py): the engine records every phase of a
multi-turn tool rollout in its row (queued for a slot, each model turn, each tool call, verify),
the job's metrics.json gives n / mean / p50 / p95 / p99 / max per phase with the run's sink writes,
and `rollmesh timing` shows them for a finished job's folder."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.manager import JobRecord
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.store import METRICS
from rollmesh.scheduler.timing import Reservoir
from rollmesh.scheduler.timing import RolloutTiming
from rollmesh.scheduler.timing import summary
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows
from tests.fakes import counter_tool_script

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])
TURN_S = 0.02  # the fake model's latency per turn


def test_summary_is_nearest_rank_and_a_reservoir_stays_bounded_and_reproducible() -> None:
    s = summary([float(v) for v in range(100, 0, -1)])
    assert s == {"n": 100, "mean": 50.5, "p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
    assert summary([]) == {"n": 0}
    a, b = Reservoir(size=10, seed=3), Reservoir(size=10, seed=3)
    for v in range(1000):
        a.add(float(v))
        b.add(float(v))
    assert len(a.values) == 10 and a.seen == 1000 and a.values == b.values
    assert summary(a.values, n=a.seen)["n"] == 1000


def test_a_rows_timing_round_trips_and_a_foreign_one_is_read_leniently() -> None:
    t = RolloutTiming(queued_s=0.5, model_s=[0.1, 0.2], tool_s=[0.01], verify_s=0.03)
    assert RolloutTiming.from_json(json.loads(json.dumps(t.to_json()))) == t
    odd = RolloutTiming.from_json({"queued_s": "soon", "model_s": [0.1, "x", True], "verify_s": 2})
    assert odd == RolloutTiming(model_s=[0.1], verify_s=2.0)


def test_rounded_is_what_the_row_reads_back_as() -> None:
    """`rounded()` (the JSONL sink's metrics of rows it wrote) equals reading the row's timing back."""
    t = RolloutTiming(1 / 3, float("nan"), 2e-7, [1 / 7, 5.3e-7], [float("inf")], [], [2 / 3], 1 / 9)
    t.add("tool_s", 1 / 11)
    t.add("verify_s", 1e-3)
    back = RolloutTiming.from_json(json.loads(json.dumps(t.to_json())))
    assert repr(t.rounded()) == repr(back)  # repr: NaN == NaN there
    assert t.rounded().tool_s == [0.090909] and t.rounded().retried_s == 0.0


async def test_every_phase_of_a_tool_rollout_is_in_its_row_and_in_the_job_percentiles(tmp_path: Path) -> None:
    path = Rows.arithmetic(3).write(tmp_path / "d.jsonl")
    spec = JobSpec(dataset=str(path), environment="session_state", concurrency=1, max_steps=8)
    sink = MemorySink()
    model = LocalModel(counter_tool_script, latency_s=TURN_S)
    run = JobRun("job-t", build_plan(CATALOG, spec), sink, model=model, env=LocalEnv(), hooks=Hooks())
    assert (await run.run(await run.open())).state == "SUCCEEDED"

    for r in sink.rollouts:  # increment, increment, get_count, answer: 4 turns, 3 tool calls
        assert r.timing is not None
        assert len(r.timing.model_s) == 4 and all(s >= TURN_S for s in r.timing.model_s)
        assert len(r.timing.tool_s) == 3 and r.timing.verify_s >= 0 and r.timing.retried_s == 0
        assert r.latency_s >= sum(r.timing.model_s)
        read_back = Rollout.from_row(json.loads(json.dumps(r.to_row()))).timing
        assert read_back is not None and read_back.to_json() == r.timing.to_json()
    # One slot: each rollout after the first waited for the one before it (4 turns at least).
    assert sorted(r.timing.queued_s for r in sink.rollouts if r.timing)[-1] >= 4 * TURN_S

    assert sink.write_times is not None and sink.write_times.seen == 3
    timing = compute(sink.rollouts, sink_writes=sink.write_times).timing
    assert {k: v["n"] for k, v in timing.items()} == {
        "queued_s": 3,
        "seed_s": 3,
        "model_s": 12,
        "tool_s": 9,
        "verify_s": 3,
        "sink_write_s": 3,
        "rollout_s": 3,
    }
    for figures in timing.values():
        assert figures["p50"] <= figures["p95"] <= figures["p99"] <= figures["max"]
    assert timing["model_s"]["p50"] >= TURN_S


async def _tool_job(tmp_path: Path) -> JobRecord:
    path = Rows.arithmetic(4).write(tmp_path / "d.jsonl")
    model = LocalModel(counter_tool_script, latency_s=TURN_S)
    mgr = JobManager(CATALOG, model=model, env=LocalEnv(), output_dir=str(tmp_path / "runs"))
    try:
        spec = JobSpec(
            dataset=str(path), environment="session_state", num_repeats=2, output_dir=str(tmp_path)
        )
        rec = await mgr.submit(spec)
        return await mgr.wait(rec.job_id)
    finally:
        await mgr.aclose()


def test_metrics_json_and_rollmesh_timing_show_the_phases_of_a_finished_job(tmp_path: Path) -> None:
    rec = asyncio.run(_tool_job(tmp_path))  # (the CLI below runs its own event loop)
    assert rec.state == "SUCCEEDED"
    stored = json.loads((rec.directory / METRICS).read_text())["timing"]
    assert stored["model_s"]["n"] == 8 * 4 and stored["tool_s"]["n"] == 8 * 3
    assert stored["sink_write_s"]["n"] == 8 and stored["rollout_s"]["n"] == 8

    result = CliRunner().invoke(build_app(), ["timing", str(rec.directory), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert list(shown) == ["queued_s", "seed_s", "model_s", "tool_s", "verify_s", "sink_write_s", "rollout_s"]
    assert shown["model_s"] == stored["model_s"] and shown["sink_write_s"] == stored["sink_write_s"]
    table = CliRunner().invoke(build_app(), ["timing", str(rec.directory)], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "one model turn" in table.stdout and "p99" in table.stdout


def test_a_rows_timing_is_each_phase_rounded_to_the_microsecond_zeros_and_odd_values_too() -> None:
    """to_json() gives round(x, 6) of every phase (a phase of 0.0 is not rounded: the same value)."""
    odd = [0.0, -0.0, 4e-7, 5e-7, 2e-06, 0.1234565, 1e16, float("nan"), float("inf"), -float("inf")]
    for x in odd:
        t = RolloutTiming(queued_s=x, retried_s=x, seed_s=x, model_s=[x, 0.0], verify_s=x)
        want = {name: round(x, 6) for name in ("queued_s", "retried_s", "seed_s", "verify_s")}
        want |= {"model_s": [round(x, 6), 0.0], "first_token_s": [], "tool_s": [], "env_step_s": []}
        assert json.dumps(t.to_json()) == json.dumps(want)
