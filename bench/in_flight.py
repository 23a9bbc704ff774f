"""65,536 rollouts in flight at once through the whole mesh, against a model that answers after 60 s.

`rollmesh up --backend fake` (registry, verifier, gateway and scheduler, each its own process, over
real gRPC) with ROLLMESH_FAKE_LATENCY_S=60 (every generation waits 60 s for its first token: the
gateway's fake backend, so nothing but the model is faked), the arithmetic environment and the JSONL
sink. One job of N single-turn rows at concurrency N; in the same run, on a fresh mesh first, the
CPU-per-rollout baseline: 8 waves of 512 (4,096 rows at concurrency 512, the model at 60/8 s, so the
job's fixed costs weigh on it as little as the same time allows).

Prints one JSON object: peak rollouts in flight (GetJob's in_flight, sampled), peak RSS of each mesh
process (VmHWM) and their sum, CPU ms per rollout of each process (user + system from /proc, over
the job only) at both concurrencies and their ratio, and whether the job completed exactly once (every
key once in rollouts.jsonl, none failed). `bounds` says which of the issue's bounds held: the mesh
under 2 GB, CPU per rollout at N not above the baseline's, every key exactly once.

    python bench/in_flight.py [--rollouts 65536] [--latency 60] [--baseline 512]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._scheduler_common import cpu_seconds
from bench._scheduler_common import env_info
from bench._scheduler_common import log
from bench._scheduler_common import mesh_up
from bench._scheduler_common import rss_mb
from bench.http_model_path import write_dataset

MESH_RSS_LIMIT_MB = 2048


def write_rows(root: Path, rollouts: int) -> Path:
    root.mkdir(parents=True)
    dataset = root / "add.jsonl"
    write_dataset(dataset, rollouts)
    return dataset


async def run_job(rollouts: int, concurrency: int, latency_s: float, root: Path) -> dict[str, Any]:
    """A fresh mesh, one job of `rollouts` rows at `concurrency`; its figures."""
    from rollmesh_client import Client
    from rollmesh_client._scheduler import FINAL_STATES
    from rollmesh_client.v1 import common_pb2
    from rollmesh_client.v1 import scheduler_pb2 as pb

    dataset = write_rows(root, rollouts)
    env = {"ROLLMESH_FAKE_LATENCY_S": str(latency_s)}
    async with mesh_up(root, "--backend", "fake", "--model", "fake", env=env) as (addresses, pids):
        spec = pb.JobSpec(
            dataset=str(dataset),
            environment="arithmetic",
            num_repeats=1,
            concurrency=concurrency,
            output_dir=str(root / "runs"),
            agent=pb.AgentSpec(max_steps=1),
            sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=16),
            retry=pb.RetryPolicy(rollout_timeout_s=max(600.0, 10 * latency_s)),
        )
        peak_in_flight = 0
        async with await Client.connect(scheduler=addresses["scheduler"]) as c:
            cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
            t0 = time.perf_counter()
            job = await c.scheduler.submit(spec)
            while True:
                j = await job.get()
                peak_in_flight = max(peak_in_flight, int(j.progress.in_flight))
                if j.state in FINAL_STATES:
                    break
                await asyncio.sleep(0.5)
            wall = time.perf_counter() - t0
            done = max(int(j.progress.done), 1)
            cpu_ms = {name: (cpu_seconds(pid) - cpu0[name]) * 1000 / done for name, pid in pids.items()}
        peak_rss = {name: round(rss_mb(pid)[1], 1) for name, pid in pids.items()}
        keys = [
            (row["task_index"], row["rollout_index"])
            for line in (root / "runs" / j.job_id / "rollouts.jsonl").read_text().splitlines()
            for row in [json.loads(line)]
        ]
    figures = {
        "state": pb.JobState.Name(j.state),
        "succeeded": int(j.progress.succeeded),
        "failed": int(j.progress.failed),
        "rows_written": len(keys),
        "exactly_once": len(keys) == len(set(keys)) == rollouts and int(j.progress.failed) == 0,
        "peak_in_flight": peak_in_flight,
        "wall_s": round(wall, 1),
        "peak_rss_mb_by_process": peak_rss,
        "mesh_peak_rss_mb": round(sum(peak_rss.values()), 1),
        "cpu_ms_per_rollout_by_process": {k: round(v, 3) for k, v in cpu_ms.items()},
        "mesh_cpu_ms_per_rollout": round(sum(cpu_ms.values()), 3),
    }
    log(f"in_flight: {rollouts} rollouts at {concurrency}: {json.dumps(figures)}")
    return figures


async def main(a: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        waves = 8  # the baseline's fixed cost per job spread over as many rows as possible in the same time
        base = await run_job(a.baseline * waves, a.baseline, a.latency / waves, Path(tmp) / "baseline")
        big = await run_job(a.rollouts, a.rollouts, a.latency, Path(tmp) / "big")
    ratio = big["mesh_cpu_ms_per_rollout"] / max(base["mesh_cpu_ms_per_rollout"], 1e-9)
    return {
        "name": "in_flight",
        "params": {
            "rollouts": a.rollouts,
            "concurrency": a.rollouts,
            "baseline": f"{a.baseline * 8} rows at concurrency {a.baseline}, model latency {a.latency / 8} s",
            "model_latency_s": a.latency,
            "mesh": "rollmesh up --backend fake (registry, verifier, gateway, scheduler processes)",
            "environment": "arithmetic, one model turn per rollout, JSONL sink",
        },
        "figures": {
            "at_concurrency": big,
            "at_baseline": base,
            "cpu_per_rollout_ratio": {"value": round(ratio, 3), "target": 1.0},
            "host_load_average_1m": {"value": round(os.getloadavg()[0], 2), "unit": "runnable tasks"},
        },
        "bounds": {
            "peak_in_flight_reached": big["peak_in_flight"] == a.rollouts,
            "exactly_once": big["exactly_once"],
            "mesh_under_2gb": big["mesh_peak_rss_mb"] < MESH_RSS_LIMIT_MB,
            "cpu_per_rollout_not_worse": ratio <= 1.0,
        },
        **env_info(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=65_536)
    ap.add_argument("--latency", type=float, default=60.0)
    ap.add_argument("--baseline", type=int, default=512)
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
