"""20,000 rollouts in flight at once against a model with 2 s latency: all complete, and the
scheduler's peak RSS stays under 2 GB. Scheduler, fake gateway (2 s latency) and fake verifier run
as separate processes over real gRPC; JSONL sink. Prints one JSON object; logs to stderr.

    python bench/concurrency.py [--rollouts 20000] [--latency 2.0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._scheduler_common import env_info
from bench._scheduler_common import fakes_args
from bench._scheduler_common import log
from bench._scheduler_common import rss_mb
from bench._scheduler_common import spawn


async def main(a: argparse.Namespace) -> dict[str, object]:
    from rollmesh_client import Client
    from rollmesh_client._scheduler import FINAL_STATES
    from rollmesh_client.v1 import scheduler_pb2 as pb
    from tests.fakes import Rows

    async with AsyncExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        _, fakes = await stack.enter_async_context(spawn(fakes_args(a.latency), name="fakes"))
        env = {"ROLLMESH_GATEWAY_ADDR": fakes, "ROLLMESH_VERIFIER_ADDR": fakes}
        pid, sched = await stack.enter_async_context(
            spawn(
                [sys.executable, "-m", "rollmesh.scheduler", "--port", "0", "--output-dir", str(tmp)], env=env
            )
        )
        dataset = Rows.arithmetic(a.rollouts).write(tmp / "d.jsonl")
        spec = pb.JobSpec(
            dataset=str(dataset),
            environment="arithmetic",
            num_repeats=1,
            concurrency=a.rollouts,
            output_dir=str(tmp),
            retry=pb.RetryPolicy(rollout_timeout_s=600),
        )
        peak_in_flight = 0
        async with await Client.connect(scheduler=sched) as c:
            t0 = time.perf_counter()
            job = await c.scheduler.submit(spec)
            while True:
                j = await job.get()
                peak_in_flight = max(peak_in_flight, j.progress.in_flight)
                if j.state in FINAL_STATES:
                    break
                await asyncio.sleep(0.25)
            wall = time.perf_counter() - t0
        _, peak_rss = rss_mb(pid)
        classes: dict[str, int] = {}
        failures = tmp / j.job_id / "failures.jsonl"
        for line in failures.read_text().splitlines() if failures.exists() else []:
            row = json.loads(line)
            key = f"{row['error_class']}: {str(row['message'])[:80]}"
            classes[key] = classes.get(key, 0) + 1
        p = j.progress
        log(
            f"{p.succeeded}/{p.total} succeeded, {p.failed} failed in {wall:.1f}s; "
            f"peak in flight {peak_in_flight}"
        )
    return {
        "name": "concurrency",
        "params": {
            "rollouts": a.rollouts,
            "concurrency": a.rollouts,
            "model_latency_s": a.latency,
            "verifier": "fake",
        },
        "figures": {
            "completed": {"value": int(p.succeeded), "unit": "rollouts"},
            "failed": {"value": int(p.failed), "unit": "rollouts", "by_class": classes},
            "peak_in_flight": {"value": peak_in_flight, "unit": "rollouts"},
            "wall_time": {"value": round(wall, 2), "unit": "s"},
            "scheduler_peak_rss": {"value": round(peak_rss, 1), "unit": "MB", "limit": 2048},
            "state": pb.JobState.Name(j.state),
        },
        **env_info(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=20_000)
    ap.add_argument("--latency", type=float, default=2.0)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
