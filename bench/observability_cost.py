"""What observability costs on the pre-hosted model path (bench/http_model_path.py's workload: N
single-turn rows at concurrency C through `rollmesh up --backend openai` against the project's
instant OpenAI-compatible server), side by side in one run, each mode its own mesh, the modes
alternated trial by trial so all see the same machine load:

- `no_tracing_code`: the mesh of `--baseline REV` (a commit before tracing existed; its services and
  SDK extracted from git into a temporary folder and put first on PYTHONPATH). Left out without
  --baseline.
- `tracing_off`: this tree, no OTEL_* variable set (the default).
- `tracing_1pct`: this tree, OTEL_EXPORTER_OTLP_ENDPOINT at an OTLP/gRPC receiver in this process
  (it counts the spans and drops them), OTEL_TRACES_SAMPLER=parentbased_traceidratio, ARG 0.01.
- `metrics_scraped_1s`: this tree with `rollmesh up --metrics`, every service's /metrics fetched
  once a second by this process during the trial.

Each trial runs every mode once, in an order rotated trial by trial (no mode always first after
a pause, or always right after another). Prints one JSON object: rollouts/s per mode (mean ±
stddev over the trials), each mode's ratio to `tracing_off` (ratio of the means, and the median of
the per-trial ratios, each trial's figure over the same trial's tracing_off: the steadier one when
the machine's load drifts), `tracing_off`'s and `tracing_1pct`'s to `no_tracing_code`, and CPU ms
per rollout of each mesh process.

    python bench/observability_cost.py [--rollouts 3000] [--concurrency 256] [--trials 2]
        [--baseline REV] [--modes tracing_off,tracing_1pct]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._scheduler_common import env_info
from bench._scheduler_common import log
from bench._scheduler_common import mesh_up
from bench.http_model_path import mesh_trial
from bench.http_model_path import write_dataset

REPO = Path(__file__).resolve().parent.parent


def extract(rev: str, into: Path) -> str:
    """`rev`'s services/ and clients/python/ under `into`; returns the PYTHONPATH that runs them."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "services", "clients/python"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return os.pathsep.join([str(into / "services"), str(into / "clients" / "python")])


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[str, list[int]]]:
    """An OTLP/gRPC trace receiver on loopback: (endpoint URL, [spans received])."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    received = [0]

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
        async def Export(self, request: Any, context: Any) -> Any:
            received[0] += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        await server.stop(grace=0)


async def scrape_every_second(urls: list[str], stop: asyncio.Event, count: list[int]) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            for url in urls:
                async with session.get(url) as resp:
                    resp.raise_for_status()
                    await resp.read()
                    count[0] += 1
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass


def paired_ratio(rates: list[float], reference: list[float]) -> float:
    """The median over trials of a mode's rollouts/s over the reference mode's in the same trial."""
    return round(statistics.median(r / ref for r, ref in zip(rates, reference, strict=True)), 3)


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "mean": round(statistics.mean(values), 1),
        "stddev": round(statistics.stdev(values), 1) if len(values) > 1 else 0.0,
        "trials": [round(v, 1) for v in values],
        "unit": "rollouts/s",
    }


async def main(a: argparse.Namespace) -> dict[str, Any]:
    from rollmesh.devtools.openai_server import openai_server_process

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        dataset = tmp / "add.jsonl"
        write_dataset(dataset, a.rollouts)
        backend = ("--backend", "openai", "--model", "tiny")
        with openai_server_process() as (base_url, _server):
            async with AsyncExitStack() as stack:
                endpoint, spans = await stack.enter_async_context(otlp_receiver())
                sampled = {
                    "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                    "OTEL_EXPORTER_OTLP_INSECURE": "true",
                    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                    "OTEL_TRACES_SAMPLER_ARG": "0.01",
                }
                modes: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {}
                if a.baseline:
                    modes["no_tracing_code"] = ({"PYTHONPATH": extract(a.baseline, tmp / "baseline")}, ())
                modes["tracing_off"] = ({}, ())
                modes["tracing_1pct"] = (sampled, ())
                modes["metrics_scraped_1s"] = ({}, ("--metrics",))
                modes = {name: m for name, m in modes.items() if name in a.modes or name == "tracing_off"}
                meshes: dict[str, tuple[dict[str, Any], dict[str, int]]] = {}
                for name, (env, extra) in modes.items():
                    (tmp / name).mkdir()
                    meshes[name] = await stack.enter_async_context(
                        mesh_up(tmp / name, *backend, "--base-url", base_url, *extra, env=env)
                    )
                rates: dict[str, list[float]] = {name: [] for name in modes}
                cpu: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
                scrapes = [0]
                order = list(modes)
                for trial in range(a.trials):
                    for name in order[trial % len(order) :] + order[: trial % len(order)]:
                        addresses, pids = meshes[name]
                        stop = asyncio.Event()
                        scraper = None
                        if name == "metrics_scraped_1s":
                            urls = [f"http://{addr}/metrics" for addr in addresses["metrics"].values()]
                            scraper = asyncio.create_task(scrape_every_second(urls, stop, scrapes))
                        try:
                            rate, cpu_ms, summary = await mesh_trial(
                                addresses["scheduler"], pids, dataset, a.concurrency, tmp / name / "runs"
                            )
                        finally:
                            stop.set()
                            if scraper is not None:
                                await scraper
                        assert summary["failed"] == 0, (name, summary)
                        log(f"trial {trial} {name}: {rate:.0f} rollouts/s")
                        rates[name].append(rate)
                        cpu[name].append(cpu_ms)
    off = statistics.mean(rates["tracing_off"])
    figures: dict[str, Any] = {name: _stats(r) for name, r in rates.items()}
    ratios = {name: round(statistics.mean(r) / off, 3) for name, r in rates.items() if name != "tracing_off"}
    paired = {
        name: paired_ratio(r, rates["tracing_off"]) for name, r in rates.items() if name != "tracing_off"
    }
    if "no_tracing_code" in rates:
        none = rates["no_tracing_code"]
        ratios["tracing_off_to_no_tracing_code"] = round(off / statistics.mean(none), 3)
        paired["tracing_off_to_no_tracing_code"] = paired_ratio(rates["tracing_off"], none)
        if "tracing_1pct" in rates:
            ratios["tracing_1pct_to_no_tracing_code"] = round(
                statistics.mean(rates["tracing_1pct"]) / statistics.mean(none), 3
            )
            paired["tracing_1pct_to_no_tracing_code"] = paired_ratio(rates["tracing_1pct"], none)
        del ratios["no_tracing_code"], paired["no_tracing_code"]
    mesh_cpu = {
        name: round(statistics.mean(sum(t.values()) for t in trials), 3) for name, trials in cpu.items()
    }
    cpu_by_process = {
        name: {p: round(statistics.mean(t[p] for t in trials), 3) for p in trials[0]}
        for name, trials in cpu.items()
    }
    return {
        "name": "observability_cost",
        "params": {
            "rollouts": a.rollouts,
            "concurrency": a.concurrency,
            "trials": a.trials,
            "baseline": a.baseline or None,
            "workload": "bench/http_model_path.py's: rollmesh up --backend openai, arithmetic, one turn",
        },
        "figures": {
            "rollouts_per_second": figures,
            "ratio_to_tracing_off": {
                "value": ratios,
                "targets": {"tracing_1pct": 0.95, "metrics_scraped_1s": 0.98},
            },
            "median_per_trial_ratio": {"value": paired},
            "mesh_cpu_per_rollout": {"value": mesh_cpu, "unit": "ms", "by_process": cpu_by_process},
            "spans_received_at_1pct": {"value": spans[0]},
            "metrics_scrapes": {"value": scrapes[0]},
            "host_load_average_1m": {"value": round(os.getloadavg()[0], 2), "unit": "runnable tasks"},
        },
        **env_info(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=3_000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument(
        "--baseline", default="", help="a git revision without tracing (its mesh is no_tracing_code)"
    )
    ap.add_argument(
        "--modes",
        type=lambda v: set(v.split(",")),
        default={"no_tracing_code", "tracing_off", "tracing_1pct", "metrics_scraped_1s"},
        help="comma-separated modes to run (tracing_off always runs: the ratios' reference)",
    )
    print(json.dumps(asyncio.run(main(ap.parse_args()))))
