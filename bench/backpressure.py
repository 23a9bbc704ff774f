"""A sink that acknowledges 50 rollouts/s: dispatch slows to its pace and the scheduler's memory
stays flat. The job engine runs in this process (remote adapters, real gRPC to a fake instant
gateway + fake verifier process) with a rate-limited sink; RSS is sampled every second and its
slope reported. Prints one JSON object; logs to stderr.

    python bench/backpressure.py [--seconds 60] [--rate 50] [--window 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._scheduler_common import env_info
from bench._scheduler_common import fakes_args
from bench._scheduler_common import log
from bench._scheduler_common import rss_mb
from bench._scheduler_common import spawn


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.mean(xs), statistics.mean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


async def main(a: argparse.Namespace) -> dict[str, object]:
    from rollmesh.mesh.logging import configure
    from rollmesh.registry import BUILTIN_ROOT
    from rollmesh.registry import Catalog
    from rollmesh.registry import Root
    from rollmesh.scheduler.engine import JobRun
    from rollmesh.scheduler.engine import RunResult
    from rollmesh.scheduler.plan import build_plan
    from rollmesh.scheduler.remote import GatewayModel
    from rollmesh.scheduler.remote import VerifierEnv
    from rollmesh.scheduler.spec import JobSpec
    from tests.fakes import Rows
    from tests.fakes import SlowSink

    configure("warning")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Rows.arithmetic(1000).write(Path(tmp) / "d.jsonl")
        async with spawn(fakes_args(0.0), name="fakes") as (_, fakes):
            model, env = GatewayModel.connect(fakes), VerifierEnv.connect(fakes)
            # Far more rollouts than the sink can take in the time: the sink sets the pace.
            spec = JobSpec(
                dataset=str(dataset), environment="arithmetic", num_repeats=1000, concurrency=a.concurrency
            )
            plan = build_plan(Catalog([Root(BUILTIN_ROOT, 0, "root")]), spec)
            sink = SlowSink(rate=a.rate, window=a.window, keep=False)  # a trainer consumes them
            run = JobRun("bp", plan, sink, model=model, env=env)
            task = asyncio.create_task(run.run(await run.open()))
            samples: list[tuple[float, float]] = []
            peak_in_flight = 0
            t0 = time.perf_counter()
            try:
                while (now := time.perf_counter() - t0) < a.seconds:
                    samples.append((now, rss_mb(os.getpid())[0]))
                    peak_in_flight = max(peak_in_flight, run.in_flight)
                    await asyncio.sleep(1.0)
            finally:
                run.stop(RunResult("CANCELLED", "benchmark over"))
                await task
                await sink.close(state="CANCELLED", metrics=None)
                await model.close()
                await env.close()
            elapsed = time.perf_counter() - t0
    warm = [s for s in samples if s[0] >= min(5.0, a.seconds / 4)]  # skip start-up allocation
    mb_per_min = slope([s[0] for s in warm], [s[1] for s in warm]) * 60 if len(warm) > 2 else 0.0
    acked = sink.acked
    log(
        f"acked {acked} in {elapsed:.1f}s; peak in flight {peak_in_flight}; RSS slope {mb_per_min:.2f} MB/min"
    )
    return {
        "name": "backpressure",
        "params": {
            "seconds": a.seconds,
            "sink_rate": a.rate,
            "sink_window": a.window,
            "concurrency": a.concurrency,
        },
        "figures": {
            "sink_throughput": {"value": round(acked / elapsed, 1), "unit": "rollouts/s"},
            "generated": {"value": int(run.progress.done), "unit": "rollouts"},
            "peak_in_flight": {"value": peak_in_flight, "unit": "rollouts", "bound": a.concurrency},
            "peak_unacked": {"value": sink.peak_unacked, "unit": "rollouts", "bound": a.window},
            "rss_first": {"value": round(samples[0][1], 1), "unit": "MB"},
            "rss_last": {"value": round(samples[-1][1], 1), "unit": "MB"},
            "rss_slope": {"value": round(mb_per_min, 3), "unit": "MB/min"},
        },
        **env_info(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=256)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
