"""`rollmesh timing PATH`: where a finished job's time went, per phase (scheduler/timing.py).

Percentiles are computed from the rows' `timing` (every row under PATH, rows of earlier runs of a
resumed job included); the sink writes' figures come from the job folder's metrics.json (a row
cannot hold its own write time), when there is one.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import err
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run
from rollmesh.commands.results import OneFile
from rollmesh.commands.results import check_rows

_SAYS = {
    "queued_s": "waiting for a concurrency slot",
    "retried_s": "failed attempts and backoff",
    "seed_s": "opening the environment session",
    "model_s": "one model turn",
    "first_token_s": "a turn's time to first token (gateway)",
    "tool_s": "one tool call",
    "env_step_s": "one environment turn",
    "verify_s": "verify",
    "sink_write_s": "one sink write (this run's, from metrics.json)",
    "rollout_s": "the whole rollout",
}


def timing(path: OneFile, as_json: JsonOut = False) -> None:
    """Where a job's time went: n, mean, p50, p95, p99 and max seconds per phase of its rollouts
    (queued, each model turn and its time to first token, tool calls, verify, sink writes)."""
    from rollmesh.scheduler.store import METRICS
    from rollmesh.scheduler.store import expand_paths
    from rollmesh.scheduler.store import load_files
    from rollmesh.scheduler.timing import PHASES
    from rollmesh.scheduler.timing import percentiles

    def figures_of() -> dict[str, Any]:  # blocking file I/O: run in a thread
        files = [f for f in expand_paths([path]) if not f.name.startswith("failures")]
        loaded = load_files(files)
        check_rows("time", [path], len(loaded.rollouts), loaded.skipped)
        timed = [(r.timing, r.latency_s) for r in loaded.rollouts if r.timing is not None]
        if not timed:
            raise ValueError(f"no row under {path} records its phases (rows written before rollmesh did)")
        figures = percentiles(timed)
        stored = {f.parent / METRICS for f in files}
        for metrics_path in sorted(p for p in stored if p.is_file()):
            sink = json.loads(metrics_path.read_text()).get("timing", {})
            if "sink_write_s" in sink:
                figures["sink_write_s"] = sink["sink_write_s"]
        ordered = {name: figures[name] for name in PHASES if name in figures}
        if len(timed) < len(loaded.rollouts):
            err.print(f"{len(loaded.rollouts) - len(timed)} rows record no phases and are left out")
        return ordered

    figures = run(asyncio.to_thread(figures_of))
    if as_json:
        print_json(figures)
        return
    columns = ["phase", "what", "n", "mean", "p50", "p95", "p99", "max"]
    rows = [
        [name, _SAYS[name], f["n"], *(f"{f[q]:.4f}" for q in ("mean", "p50", "p95", "p99", "max"))]
        for name, f in figures.items()
    ]
    print_table(f"timing of {Path(path)} (seconds)", columns, rows)


def register(app: typer.Typer) -> None:
    app.command("timing")(timing)
