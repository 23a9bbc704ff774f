"""The pre-hosted model path over HTTP: N single-turn "What is A + B?" rows at concurrency C through
`rollmesh up --backend openai` (every service its own process) against the project's own instant
OpenAI-compatible server (rollmesh.devtools.openai_server, its own process), and, in the same run,
a plain aiohttp client loop against the same server (the ceiling a client can reach).

Prints one JSON object: rollouts/s for both (mean ± stddev over the trials), their ratio, CPU ms
per rollout of each mesh process (user + system from /proc, load-independent) and of the model
server, peak RSS of each mesh process (VmHWM) and their sum.

    python bench/http_model_path.py [--rollouts 10000] [--concurrency 512] [--trials 2] [--quick]

`--quick` is 3,000 rollouts and one trial (about 20 s of measuring on an idle 2-core machine, plus
the mesh's start). The raw loop is the same workload at the same concurrency against the same
server in the same process tree state: C workers over one aiohttp pool of C connections, each
request the non-streaming chat completion the gateway sends (same body fields as the gateway's
OpenAI backend), its answer parsed; its CPU per request is this client process's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._scheduler_common import cpu_seconds
from bench._scheduler_common import env_info
from bench._scheduler_common import log
from bench._scheduler_common import mesh_up
from bench._scheduler_common import rss_mb


def write_dataset(path: Path, rows: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(rows):
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            row = {
                "responses_create_params": {"input": [{"role": "user", "content": f"What is {a} + {b}?"}]},
                "expected_answer": str(a + b),
                "task_id": f"add-{i}",
            }
            f.write(json.dumps(row) + "\n")


# -- the raw client loop -------------------------------------------------------------------------


async def raw_loop(base_url: str, dataset: Path, concurrency: int) -> tuple[float, float, int]:
    """(requests/s, CPU ms per request of this client, answers with content): every row as one
    non-streaming chat completion, C at a time. A request that fails raises (a raw loop that skips
    failures would look faster than it is)."""
    import aiohttp

    prompts = [json.loads(line)["responses_create_params"]["input"] for line in dataset.open()]
    queue = iter(prompts)
    answered = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal answered
        for messages in queue:
            body = {
                "model": "tiny",
                "messages": messages,
                "temperature": 1.0,
                "top_p": 1.0,
                "max_tokens": 16,
                "return_token_ids": True,
            }
            async with session.post(f"{base_url}/chat/completions", json=body) as resp:
                resp.raise_for_status()
                out = await resp.json()
            if out["choices"][0]["message"]["content"]:
                answered += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if answered != len(prompts):
        raise RuntimeError(f"the raw loop got {answered} answers with content of {len(prompts)}")
    return len(prompts) / wall, cpu * 1000 / len(prompts), answered


# -- the mesh ------------------------------------------------------------------------------------


async def mesh_trial(
    scheduler: str, pids: dict[str, int], dataset: Path, concurrency: int, out: Path
) -> tuple[float, dict[str, float], dict[str, Any]]:
    """(rollouts/s end to end, CPU ms per rollout by process, job summary)."""
    from rollmesh_client import Client
    from rollmesh_client.v1 import common_pb2
    from rollmesh_client.v1 import scheduler_pb2 as pb

    spec = pb.JobSpec(
        dataset=str(dataset),
        environment="arithmetic",
        num_repeats=1,
        concurrency=concurrency,
        output_dir=str(out),
        agent=pb.AgentSpec(max_steps=1),
        sampling=common_pb2.SamplingParams(temperature=1.0, top_p=1.0, max_tokens=16),  # as the raw loop
    )
    async with await Client.connect(scheduler=scheduler) as c:
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        t0 = time.perf_counter()
        job = await c.scheduler.submit(spec)
        final = await job.result(poll_s=0.05, timeout_s=3600)  # a coarse poll would count as mesh time
        wall = time.perf_counter() - t0
        done = max(final.progress.done, 1)
        cpu_ms = {name: (cpu_seconds(pid) - cpu0[name]) * 1000 / done for name, pid in pids.items()}
        metrics = await job.metrics()
    p = final.progress
    summary = {
        "done": p.done,
        "failed": p.failed,
        "total": p.total,
        "scheduler_rollouts_per_second": round(float(p.rollouts_per_second), 1),
        "mean_reward": round(float(metrics.mean_reward), 4),
    }
    log(f"mesh trial: {summary}, {done / wall:.0f}/s end to end, CPU ms/rollout {cpu_ms}")
    return done / wall, cpu_ms, summary


def _stats(values: list[float], unit: str) -> dict[str, Any]:
    return {
        "mean": round(statistics.mean(values), 1),
        "stddev": round(statistics.stdev(values), 1) if len(values) > 1 else 0.0,
        "trials": [round(v, 1) for v in values],
        "unit": unit,
    }


async def main(a: argparse.Namespace) -> dict[str, Any]:
    from rollmesh.devtools.openai_server import openai_server_process

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        dataset = tmp / "add.jsonl"
        write_dataset(dataset, a.rollouts)
        with openai_server_process() as (base_url, server):
            async with AsyncExitStack() as stack:
                addresses, pids = await stack.enter_async_context(
                    mesh_up(tmp, "--backend", "openai", "--base-url", base_url, "--model", "tiny")
                )
                raw_rates: list[float] = []
                raw_cpu_ms: list[float] = []
                mesh_rates: list[float] = []
                cpu_trials: list[dict[str, float]] = []
                summaries: list[dict[str, Any]] = []
                server_cpu_ms: list[float] = []
                for trial in range(a.trials):  # alternate, so both see the same machine load
                    rate, cpu_per_request, _ = await raw_loop(base_url, dataset, a.concurrency)
                    log(f"raw trial {trial}: {rate:.0f}/s, {cpu_per_request:.3f} ms CPU/request")
                    raw_rates.append(rate)
                    raw_cpu_ms.append(cpu_per_request)
                    s0 = cpu_seconds(server.pid)
                    rate, cpu_ms, summary = await mesh_trial(
                        addresses["scheduler"], pids, dataset, a.concurrency, tmp / "runs"
                    )
                    server_cpu_ms.append((cpu_seconds(server.pid) - s0) * 1000 / max(summary["done"], 1))
                    mesh_rates.append(rate)
                    cpu_trials.append(cpu_ms)
                    summaries.append(summary)
                peak_rss = {name: round(rss_mb(pid)[1], 1) for name, pid in pids.items()}
    cpu = {name: round(statistics.mean(t[name] for t in cpu_trials), 3) for name in cpu_trials[0]}
    ratio = statistics.mean(mesh_rates) / statistics.mean(raw_rates)
    return {
        "name": "http_model_path",
        "params": {
            "rollouts": a.rollouts,
            "concurrency": a.concurrency,
            "trials": a.trials,
            "mesh": "rollmesh up --backend openai (registry, verifier, gateway, scheduler processes)",
            "model_server": "rollmesh.devtools.openai_server (instant, its own process, uvloop)",
            "environment": "arithmetic, one model turn per rollout, JSONL sink",
            "raw_client": "aiohttp, non-streaming chat completions, C workers over one pool",
            "event_loop": os.environ.get("ROLLMESH_EVENT_LOOP") or "auto (uvloop when installed)",
        },
        "figures": {
            "mesh_rollouts_per_second": _stats(mesh_rates, "rollouts/s"),
            "raw_client_requests_per_second": _stats(raw_rates, "requests/s"),
            "ratio_mesh_to_raw": {"value": round(ratio, 3), "target": 0.40},
            # Load-independent: what one request costs the raw client vs. what a rollout costs the mesh.
            "raw_client_cpu_per_request": {"value": round(statistics.mean(raw_cpu_ms), 3), "unit": "ms"},
            "cpu_per_rollout_by_process": {"value": cpu, "unit": "ms"},
            "gateway_cpu_per_call": {"value": cpu.get("gateway", 0.0), "unit": "ms", "target": 0.8},
            "mesh_cpu_per_rollout": {"value": round(sum(cpu.values()), 3), "unit": "ms", "target": 2.5},
            "model_server_cpu_per_rollout": {"value": round(statistics.mean(server_cpu_ms), 3), "unit": "ms"},
            "peak_rss_by_process": {"value": peak_rss, "unit": "MB"},
            "mesh_peak_rss": {"value": round(sum(peak_rss.values()), 1), "unit": "MB", "target": 600},
            "jobs": summaries,
            "host_load_average_1m": {"value": round(os.getloadavg()[0], 2), "unit": "runnable tasks"},
        },
        **env_info(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="3,000 rollouts, one trial")
    args = ap.parse_args()
    if args.quick:
        args.rollouts, args.trials = 3_000, 1
    print(json.dumps(asyncio.run(main(args))))
