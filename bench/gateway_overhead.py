"""Latency the gateway adds over calling the backend directly (zero-latency FakeBackend).

    .venv/bin/python bench/gateway_overhead.py [--trials 5] [--requests 400] [--log-level info]

One request at a time (latency, not throughput), all in one process and event loop:
- `direct`: `backend.generate(EngineRequest)` with pre-tokenized prompt ids, iterated to the end.
- `gateway_inproc`: `Gateway.generate` (validation, chat template + tokenize, tool-call parse,
  accounting), no transport.
- `grpc`: `Generate` through a real grpc.aio server on 127.0.0.1 via the SDK client (interceptor,
  one log line per RPC at --log-level, proto conversion, loopback transport, client included).
- `grpc_health`: a Health.Check round trip on the same server: the transport floor (health is
  exempt from the mesh interceptor, so no log line).
- `grpc_trivial_rpc`: `CloseSession` of an unknown session: transport + mesh interceptor + its log
  line, with no generation. `grpc - grpc_trivial_rpc` is what Generate itself costs.

Per trial: p50/p99 of each; figures are mean ± stddev over trials. `added_p50_ms` is grpc minus
direct p50 within the same trial. Prints ONE JSON object to stdout; logs go to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._meta import env_info
from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import Message
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.base import Sampling
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.logging import configure
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh_client import Client

log = get_logger("bench.gateway_overhead")

MESSAGES = [
    {"role": "system", "content": "Answer with a number."},
    {"role": "user", "content": "What is 5 + 7?"},
]


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def sample(call: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    """Latencies in ms of `n` sequential calls."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def summary(values: list[float]) -> dict[str, float]:
    return {
        "mean": round(statistics.fmean(values), 4),
        "stddev": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
    }


async def main(trials: int, requests: int) -> dict[str, Any]:
    backend = FakeBackend("tiny", script=lambda prompt, req: "12")
    gateway = Gateway([backend])
    await gateway.start()
    server = await build_server([ServiceBinding.of(GatewayServicer(gateway))], "127.0.0.1:0")
    await server.start()
    await wait_serving(server.address, timeout_s=30)
    client = await Client.connect(gateway=server.address, timeout_s=30)
    health = health_pb2_grpc.HealthStub(client.channel("gateway"))
    msgs = tuple(Message(m["role"], m["content"]) for m in MESSAGES)
    ids = tuple(backend.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    engine_req = EngineRequest(request_id="direct", sampling=Sampling(max_tokens=256), prompt_token_ids=ids)

    async def direct() -> None:
        async for _ in backend.generate(engine_req):
            pass

    async def inproc() -> None:
        await gateway.generate(GenerateInput(messages=msgs))

    async def via_grpc() -> None:
        r = await client.gateway.generate(MESSAGES)
        assert r.message.content == "12"

    async def health_check() -> None:
        await health.Check(health_pb2.HealthCheckRequest(), timeout=10)

    async def close_session() -> None:
        await client.gateway.close_session("none")

    paths = {
        "direct": direct,
        "gateway_inproc": inproc,
        "grpc": via_grpc,
        "grpc_health": health_check,
        "grpc_trivial_rpc": close_session,
    }
    per_trial: dict[str, dict[str, list[float]]] = {p: {"p50": [], "p99": []} for p in paths}
    added: list[float] = []
    added_vs_health: list[float] = []
    added_vs_trivial: list[float] = []
    try:
        for call in paths.values():  # warm up every path (imports, channel, caches)
            await sample(call, 50)
        for t in range(trials):
            p50s: dict[str, float] = {}
            for name, call in paths.items():
                lat = await sample(call, requests)
                p50s[name] = percentile(lat, 0.5)
                per_trial[name]["p50"].append(p50s[name])
                per_trial[name]["p99"].append(percentile(lat, 0.99))
            added.append(p50s["grpc"] - p50s["direct"])
            added_vs_health.append(p50s["grpc"] - p50s["grpc_health"])
            added_vs_trivial.append(p50s["grpc"] - p50s["grpc_trivial_rpc"])
            log.info("trial_done", trial=t, **{k: round(v, 4) for k, v in p50s.items()})
    finally:
        await client.close()
        await server.stop(grace=0)
        await gateway.shutdown()
    return {
        "name": "gateway_overhead",
        "params": {
            "trials": trials,
            "requests_per_trial": requests,
            "concurrency": 1,
            "backend": "FakeBackend(zero latency, 3 output tokens)",
            "prompt_tokens": len(ids),
            "log_level": os.environ.get("BENCH_LOG_LEVEL", "info"),
        },
        "figures": {
            **{f"{name}_{q}_ms": summary(vals) for name, qs in per_trial.items() for q, vals in qs.items()},
            "added_p50_ms": summary(added),
            "grpc_minus_transport_floor_p50_ms": summary(added_vs_health),
            "grpc_minus_trivial_rpc_p50_ms": summary(added_vs_trivial),
            "target_added_p50_ms": 1.0,
            "target_met": statistics.fmean(added) < 1.0,
        },
        "units": "milliseconds per request (mean ± stddev over trials)",
        **env_info("grpcio", "protobuf", "structlog", "rollmesh"),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    os.environ["BENCH_LOG_LEVEL"] = args.log_level
    configure(args.log_level, json=True)
    result = asyncio.run(main(args.trials, args.requests))
    sys.stdout.write(json.dumps(result) + "\n")
