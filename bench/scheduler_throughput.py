"""Rollouts/s through real gRPC hops: a scheduler process -> a fake instant gateway process + the
real verifier process (environment `arithmetic`; the fake verifier if the real one cannot start),
JSONL sink, one model turn per rollout. Besides rollouts/s it reports the CPU time each process
spends per rollout (user + system, from /proc): on a shared machine that is far less noisy than wall
throughput, and their sum says what one rollout costs the whole mesh.

    python bench/scheduler_throughput.py [--rollouts 8000] [--trials 2] [--concurrency 256]
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
from contextlib import AsyncExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._scheduler_common import REPO
from bench._scheduler_common import cpu_seconds
from bench._scheduler_common import env_info
from bench._scheduler_common import fakes_args
from bench._scheduler_common import log
from bench._scheduler_common import spawn


async def one_trial(
    scheduler: str, pids: dict[str, int], dataset: Path, rollouts: int, concurrency: int, out: Path
) -> tuple[float, dict[str, float]]:
    """(rollouts/s, CPU ms per rollout of each process in `pids`)."""
    from rollmesh_client import Client
    from rollmesh_client.v1 import scheduler_pb2 as pb

    rows = sum(1 for _ in dataset.open())
    spec = pb.JobSpec(
        dataset=str(dataset),
        environment="arithmetic",
        num_repeats=max(1, rollouts // rows),
        concurrency=concurrency,
        output_dir=str(out),
        agent=pb.AgentSpec(max_steps=1),
    )
    async with await Client.connect(scheduler=scheduler) as c:
        t0, cpu0 = time.perf_counter(), {name: cpu_seconds(pid) for name, pid in pids.items()}
        job = await c.scheduler.submit(spec)
        final = await job.result(poll_s=0.2, timeout_s=600)
        wall = time.perf_counter() - t0
        done = max(final.progress.done, 1)
        cpu_ms = {name: (cpu_seconds(pid) - cpu0[name]) * 1000 / done for name, pid in pids.items()}
    p = final.progress
    if p.failed or p.done != p.total:
        log(f"trial: {p.failed} failed, {p.done}/{p.total} done: {final.error}")
    log(
        f"trial: {p.done} rollouts in {wall:.2f}s wall, {p.rollouts_per_second:.0f}/s by the scheduler, "
        "CPU ms/rollout " + ", ".join(f"{k} {v:.2f}" for k, v in cpu_ms.items())
    )
    return float(p.rollouts_per_second), cpu_ms


async def environment_is_stateless(verifier: str, name: str) -> bool:
    """What the scheduler learns once per job: a stateless environment needs no verifier session."""
    from rollmesh_client import Client

    async with await Client.connect(verifier=verifier) as c:
        return bool((await c.verifier.get(name)).stateless)


async def main(a: argparse.Namespace) -> dict[str, object]:
    dataset = REPO / "services/rollmesh/builtin/datasets/arithmetic/test.jsonl"
    async with AsyncExitStack() as stack:
        fakes_pid, fakes = await stack.enter_async_context(spawn(fakes_args(0.0), name="fakes"))
        verifier_kind, verifier_pid = "real", 0
        try:
            if a.fake_verifier:
                raise RuntimeError("--fake-verifier given")
            # `python -m rollmesh.verifier` takes no flags: it binds ROLLMESH_VERIFIER_ADDR, by default
            # :50052, and with that port taken (another mesh, a test) this bench fell back to the fake
            # verifier. Port 0: a free one, written to the port file.
            verifier_pid, verifier = await stack.enter_async_context(
                spawn(
                    [sys.executable, "-m", "rollmesh.verifier"],
                    env={"ROLLMESH_VERIFIER_ADDR": "127.0.0.1:0"},
                    name="verifier",
                )
            )
        except Exception as exc:  # the real verifier is optional here: say so in the report
            log(f"real verifier unavailable ({str(exc)[:300]}); using the fake verifier")
            verifier, verifier_kind = fakes, "fake"
        env = {"ROLLMESH_GATEWAY_ADDR": fakes, "ROLLMESH_VERIFIER_ADDR": verifier}
        stateless = await environment_is_stateless(verifier, "arithmetic")
        with tempfile.TemporaryDirectory() as tmp:
            sched_pid, sched = await stack.enter_async_context(
                spawn(
                    [sys.executable, "-m", "rollmesh.scheduler", "--port", "0", "--output-dir", tmp],
                    env=env,
                    name="scheduler",
                )
            )
            pids = {"scheduler": sched_pid}
            if verifier_pid:
                pids.update(gateway=fakes_pid, verifier=verifier_pid)
            else:
                pids["gateway+verifier"] = fakes_pid
            trials = [
                await one_trial(sched, pids, dataset, a.rollouts, a.concurrency, Path(tmp))
                for _ in range(a.trials)
            ]
    rates = [t[0] for t in trials]
    cpu = {name: statistics.mean(t[1][name] for t in trials) for name in trials[0][1]}
    load = os.getloadavg()[0]
    return {
        "name": "scheduler_throughput",
        "params": {
            "rollouts_per_trial": a.rollouts,
            "trials": a.trials,
            "concurrency": a.concurrency,
            "gateway": "fake (instant), separate process",
            "verifier": f"{verifier_kind} (arithmetic), separate process",
            "sink": "jsonl",
            "max_steps": 1,
            # One Generate (no gateway session for one turn) and one Verify, each a message on a
            # long-lived stream (GenerateMany, VerifyBatch); unary SeedSession and CloseSession on
            # the verifier too unless the environment is stateless
            "environment_stateless": stateless,
            "stream_messages_per_rollout": 2,
            "unary_rpcs_per_rollout": 0 if stateless else 2,
        },
        "figures": {
            "rollouts_per_second": {
                "mean": round(statistics.mean(rates), 1),
                "stddev": round(statistics.stdev(rates), 1) if len(rates) > 1 else 0.0,
                "unit": "rollouts/s",
            },
            "scheduler_cpu_per_rollout": {"mean": round(cpu["scheduler"], 3), "unit": "ms"},
            "cpu_per_rollout_by_process": {
                "value": {name: round(v, 3) for name, v in cpu.items()},
                "unit": "ms",
            },
            "mesh_cpu_per_rollout": {"value": round(sum(cpu.values()), 3), "unit": "ms"},
            "scheduler_capacity_one_core": {"value": round(1000 / cpu["scheduler"], 1), "unit": "rollouts/s"},
            "mesh_capacity_two_cores": {
                "value": round(2000 / sum(cpu.values()), 1),
                "unit": "rollouts/s",
                "note": "2 cores / summed CPU per rollout: what an idle 2-core host could reach",
            },
            "host_load_average_1m": {"value": round(load, 2), "unit": "runnable tasks"},
            "target": {"value": 1000, "unit": "rollouts/s"},
        },
        **env_info(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=8000)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument(
        "--fake-verifier", action="store_true", help="Use the fake verifier instead of the real one."
    )
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
