"""Throughput of a job whose model hangs on 1% of calls, against the same job without hangs (#12.5).

Every hop is real: the project's OpenAI-compatible test server (rollmesh.devtools.openai_server,
`latency_s` per call, `hang_every` 100 = 1% of calls never answer) in its own process, the gateway
(openai backend), the real verifier and the scheduler, each a process. Trials alternate: clean,
then 1% hung with the adaptive per-call deadline (the product's defaults), optionally 1% hung with
`fixed_attempt_deadline` (every attempt gets `rollout_timeout_s`, the old behaviour). The ratio
`hung_over_clean` is throughput with hangs / without (target >= 0.8), from one run side by side.

    python bench/hung_calls.py [--rollouts 2000] [--concurrency 64] [--latency 0.2] [--trials 2]
                               [--with-fixed --fixed-timeout 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import AsyncExitStack
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._scheduler_common import env_info
from bench._scheduler_common import log
from bench._scheduler_common import spawn

ROLLMESH = Path(sys.executable).parent / "rollmesh"


def set_faults(base_url: str, faults: object) -> None:
    """POST a FaultConfig to the test server (blocking: called between trials, never during one)."""
    body = json.dumps(asdict(faults)).encode()  # type: ignore[call-overload]
    url = base_url.removesuffix("/v1") + "/_faults"
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


async def trial(
    scheduler: str, dataset: Path, out: Path, a: argparse.Namespace, *, fixed: bool
) -> dict[str, float]:
    from rollmesh_client import Client
    from rollmesh_client.v1 import scheduler_pb2 as pb

    retry = pb.RetryPolicy(fixed_attempt_deadline=fixed)
    if fixed:
        retry.rollout_timeout_s = a.fixed_timeout
    spec = pb.JobSpec(
        dataset=str(dataset),
        environment="arithmetic",
        concurrency=a.concurrency,
        output_dir=str(out),
        agent=pb.AgentSpec(max_steps=1),
        retry=retry,
    )
    async with await Client.connect(scheduler=scheduler) as c:
        t0 = time.perf_counter()
        job = await c.scheduler.submit(spec)
        final = await job.result(poll_s=0.1, timeout_s=3600)
        wall = time.perf_counter() - t0
    p = final.progress
    if final.state != pb.JOB_STATE_SUCCEEDED:
        log(f"trial ended {pb.JobState.Name(final.state)}: {final.error}")
    return {
        "rollouts_per_s": p.succeeded / wall,
        "wall_s": wall,
        "retries": float(p.retries),
        "failed": float(p.failed),
    }


def summary(trials: list[dict[str, float]]) -> dict[str, object]:
    rates = [t["rollouts_per_s"] for t in trials]
    return {
        "rollouts_per_s": round(statistics.fmean(rates), 2),
        "rollouts_per_s_std": round(statistics.stdev(rates), 2) if len(rates) > 1 else 0.0,
        "wall_s": [round(t["wall_s"], 2) for t in trials],
        "retries": [int(t["retries"]) for t in trials],
        "failed": [int(t["failed"]) for t in trials],
    }


async def main(a: argparse.Namespace) -> dict[str, object]:
    from rollmesh.devtools.openai_server import FaultConfig
    from rollmesh.devtools.openai_server import Frequency
    from rollmesh.devtools.openai_server import openai_server_process
    from tests.fakes import Rows

    clean = FaultConfig(latency_s=a.latency)
    hung = FaultConfig(latency_s=a.latency, hang=Frequency(every=100))
    results: dict[str, list[dict[str, float]]] = {"clean": [], "hung_adaptive": [], "hung_fixed": []}
    with tempfile.TemporaryDirectory() as tmp_name, openai_server_process(clean) as (base_url, _):
        tmp = Path(tmp_name)
        dataset = Rows.arithmetic(a.rollouts).write(tmp / "d.jsonl")
        async with AsyncExitStack() as stack:
            gw_args = [str(ROLLMESH), "serve", "gateway", "--port", "0", "--http-port", "-1"]
            gw_args += ["--backend", "openai", "--base-url", base_url, "--model", "tiny"]
            _, gateway = await stack.enter_async_context(spawn(gw_args, name="gateway"))
            _, verifier = await stack.enter_async_context(
                spawn([str(ROLLMESH), "serve", "verifier", "--port", "0"], name="verifier")
            )
            env = {"ROLLMESH_GATEWAY_ADDR": gateway, "ROLLMESH_VERIFIER_ADDR": verifier}
            sched_args = [
                str(ROLLMESH),
                "serve",
                "scheduler",
                "--port",
                "0",
                "--output-dir",
                str(tmp / "runs"),
            ]
            _, scheduler = await stack.enter_async_context(spawn(sched_args, env=env, name="scheduler"))
            for i in range(a.trials):
                plan = [("clean", clean, False), ("hung_adaptive", hung, False)]
                if a.with_fixed:
                    plan.append(("hung_fixed", hung, True))
                for name, faults, fixed in plan:
                    await asyncio.to_thread(set_faults, base_url, faults)
                    r = await trial(scheduler, dataset, tmp / "runs", a, fixed=fixed)
                    log(f"trial {i} {name}: {r['rollouts_per_s']:.1f} rollouts/s in {r['wall_s']:.1f} s")
                    results[name].append(r)
    figures: dict[str, object] = {k: summary(v) for k, v in results.items() if v}
    clean_rate = statistics.fmean(t["rollouts_per_s"] for t in results["clean"])
    hung_rate = statistics.fmean(t["rollouts_per_s"] for t in results["hung_adaptive"])
    figures["hung_over_clean"] = round(hung_rate / clean_rate, 3)
    if results["hung_fixed"]:
        fixed_rate = statistics.fmean(t["rollouts_per_s"] for t in results["hung_fixed"])
        figures["hung_fixed_over_clean"] = round(fixed_rate / clean_rate, 3)
    return {
        "name": "hung_calls",
        "params": {
            "rollouts": a.rollouts,
            "concurrency": a.concurrency,
            "latency_s": a.latency,
            "hang_every": 100,
            "trials": a.trials,
            "fixed_timeout_s": a.fixed_timeout if a.with_fixed else None,
        },
        "figures": figures,
        **env_info(),
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rollouts", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--with-fixed", action="store_true", help="also run 1%% hung with a fixed deadline")
    p.add_argument("--fixed-timeout", type=float, default=30.0)
    print(json.dumps(asyncio.run(main(p.parse_args())), indent=2))
