"""Verifies per second for `arithmetic`, `math` (one task again and again, and `math_new_task`: a
task not seen for 4,096 verifies each time) and `code`: through the domain layer and through gRPC
`VerifyBatch`. Prints ONE JSON object to stdout; logs go to stderr.

    .venv/bin/python bench/verify_throughput.py [--trials 3] [--seconds 2.5] [--envs code,math]

Each figure is the mean ± stddev over fixed-duration trials, with a window of requests in flight;
`domain_cpu_ms_per_verify` is the CPU the domain trials cost per verify, by process kind (this
process, its sandboxes, the math workers), what a loaded machine's other work skews least.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._meta import cpu_by_process
from bench._meta import cpu_ms_per
from bench._meta import env_info
from rollmesh.mesh.logging import configure
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import Response
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import Client
from rollmesh_client._verifier import verify_request

log = get_logger("bench.verify_throughput")

WORKLOADS: dict[str, tuple[dict[str, Any], str]] = {
    "arithmetic": (
        {
            "responses_create_params": {"input": [{"role": "user", "content": "What is 30 + 38?"}]},
            "expected_answer": "68",
        },
        "The answer is 68.",
    ),
    "math": ({"expected_answer": "\\frac{5}{6}"}, "Adding the fractions gives \\boxed{\\frac{10}{12}}."),
    "code": (
        {"verifier_metadata": {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]}},
        "```python\ndef add(a, b):\n    return a + b\n```",
    ),
}
# `math_new_task`: math with a task not checked in the last NEW_TASKS verifies each time, so every
# check parses its reference anew (math keeps the last 1,024 it parsed: a task's samples share one
# parse, as in RL; an evaluation's single sample per task is this workload).
NEW_TASKS = 4096
WINDOW = {"arithmetic": 64, "math": 16, "math_new_task": 16, "code": 8}


def workload(env: str, i: int) -> tuple[str, dict[str, Any], str]:
    """The `i`th verify of a workload: (environment, task, response text); each is rewarded 1."""
    if env == "math_new_task":
        n = 7 + i % NEW_TASKS
        task = {"expected_answer": f"\\frac{{{n}}}{{{n + 1}}}"}
        return "math", task, f"Reducing gives \\boxed{{\\frac{{{2 * n}}}{{{2 * n + 2}}}}}."
    task, text = WORKLOADS[env]
    return env, task, text


async def timed_trial(
    run_one: Callable[[], Awaitable[float]], seconds: float, window: int, counted: list[int] | None = None
) -> float:
    """Completed verifies per second with `window` concurrent loops for `seconds` (their number
    added to `counted`, when given)."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            reward = await run_one()
            assert reward == 1.0, reward
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(window)))
    if counted is not None:
        counted.append(done)
    return done / (time.perf_counter() - start)


async def grpc_trial(client: Client, env: str, seconds: float, window: int) -> float:
    done = 0
    deadline = time.perf_counter() + seconds
    in_flight = asyncio.Semaphore(window)

    async def requests() -> AsyncIterator[tuple[str, Any]]:
        i = 0
        while time.perf_counter() < deadline:
            await in_flight.acquire()
            yield str(i), verify_request(*workload(env, i))
            i += 1

    start = time.perf_counter()
    async for item in client.verifier.verify_batch(requests(), timeout_s=seconds + 60):
        assert item.WhichOneof("outcome") == "result" and item.result.reward == 1.0, item
        done += 1
        in_flight.release()
    return done / (time.perf_counter() - start)


def call_of(env: str, task: dict[str, Any], text: str) -> VerifyCall:
    return VerifyCall(env, json.dumps(task), Response.from_text(text))


def _label(name: str, cmdline: str) -> str:
    if "runner.py" in cmdline or name in ("unshare", "sh", "chroot"):
        return "sandboxes"
    return "math workers" if "_worker" in cmdline else "verifier"


def stats(values: list[float]) -> dict[str, float | str | list[float]]:
    return {
        "mean": round(statistics.fmean(values), 2),
        "stddev": round(statistics.stdev(values), 2) if len(values) > 1 else 0.0,
        "unit": "verifies/s",
        "trials": [round(v, 2) for v in values],
    }


async def main(trials: int, seconds: float, envs: list[str]) -> dict[str, Any]:
    cfg = replace(VerifierConfig(), workers=2, batch_concurrency=64)
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(cfg, Catalog.from_config(roots), entry_points=False)
    await svc.start()
    isolation = svc.environment("code").sandbox.isolation  # type: ignore[attr-defined]
    await svc.environment("math").context.workers.warm()
    server = await build_server([ServiceBinding.of(VerifierServicer(svc))], "127.0.0.1:0")
    await server.start()
    await wait_serving(server.address, timeout_s=30)
    client = await Client.connect(verifier=server.address)
    figures: dict[str, Any] = {}
    try:
        for env in envs:
            calls = [call_of(*workload(env, i)) for i in range(NEW_TASKS if env == "math_new_task" else 1)]
            turn = itertools.count()

            async def one(calls: list[VerifyCall] = calls, turn: Iterator[int] = turn) -> float:
                return (await svc.verify(calls[next(turn) % len(calls)])).reward

            await timed_trial(one, 0.3, WINDOW[env])  # warm-up
            counted: list[int] = []
            cpu0 = cpu_by_process(_label, tree_of=os.getpid(), reaped=True)
            domain = [await timed_trial(one, seconds, WINDOW[env], counted) for _ in range(trials)]
            cpu = cpu_ms_per(_label, cpu0, sum(counted), tree_of=os.getpid(), reaped=True, digits=3)
            log.info("bench_domain", env=env, trials=domain, cpu_ms_per_verify=cpu)
            via_grpc = [await grpc_trial(client, env, seconds, WINDOW[env]) for _ in range(trials)]
            log.info("bench_grpc", env=env, trials=via_grpc)
            figures[env] = {
                "domain": stats(domain),
                "grpc_verify_batch": stats(via_grpc),
                # the domain trials' CPU, by process kind (what this machine's other work cannot skew)
                "domain_cpu_ms_per_verify": {**cpu, "total": round(sum(cpu.values()), 3)},
            }
    finally:
        await client.close()
        await server.stop(0)
        await svc.aclose()
    return {
        "name": "verify_throughput",
        "params": {
            "trials": trials,
            "trial_seconds": seconds,
            "window": WINDOW,
            "math_workers": cfg.workers,
            "sandbox_concurrency": cfg.sandbox.concurrency,
            "sandbox_isolation": isolation,
        },
        "figures": figures,
        **env_info("grpcio", "protobuf", "math-verify", "rollmesh"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--envs", default=",".join(WINDOW), help="comma-separated subset of workloads")
    args = parser.parse_args()
    configure(level="warning" if not os.environ.get("BENCH_VERBOSE") else "info")
    result = asyncio.run(main(args.trials, args.seconds, [e for e in args.envs.split(",") if e]))
    sys.stdout.write(json.dumps(result) + "\n")
