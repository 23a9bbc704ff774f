"""What `rollmesh serve openenv` adds to a step (rollmesh/openenv_server): one tool call of the
built-in `session_state` environment per step, N steps of one episode, each way in the same run:

- `served`: OpenEnv's own `GenericEnvClient` (tests/openenv_envs/own_client.py, the OpenEnv
  interpreter, timed inside its process) against the OpenEnv server, which turns each step into the
  verifier's CallTool over gRPC;
- `verifier_grpc`: the same CallTool through the SDK on loopback, what the server itself calls.

Both servers (the OpenEnv server and the verifier's gRPC server) run in this process, so its CPU per
step is what rollmesh spends on a step: for `served` the OpenEnv server and the verifier, for
`verifier_grpc` the SDK and the verifier. Prints ONE JSON object to stdout (logs go to stderr): wall
µs per step and this process's CPU µs per step, mean ± stddev over trials (the two alternate, so
drift in the machine's load hits both alike), the best trial, the ratios, and the load average
before and after (the machine is shared).

    .venv/bin/python bench/openenv_serve.py [--trials 5] [--steps 500]

Needs the OpenEnv virtualenv (scripts/openenv_venv.py: built once, cached).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._meta import env_info
from bench._meta import load_script
from bench._meta import log
from bench._meta import result_stream
from bench._meta import step_figures
from bench._meta import trial_args
from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.openenv_server.server import openenv_server
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import Client
from tests.openenv_servers import own_client

DATA = BUILTIN_ROOT / "environments" / "session_state" / "data" / "example.jsonl"
ROW = json.loads(DATA.read_text().splitlines()[0])
ACTION = {"tool_calls": [{"name": "get_counter_value", "arguments": {}}]}


async def main() -> None:
    args = trial_args(__doc__)
    out = result_stream()
    configure(level="warning")
    python = Path(load_script("openenv_venv").venv())
    load_before = os.getloadavg()
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await svc.start()
    server = await build_server([ServiceBinding.of(VerifierServicer(svc))], "127.0.0.1:0", api_key="")
    await server.start()
    await wait_serving(server.address, timeout_s=60)
    wall: dict[str, list[float]] = {"served": [], "verifier_grpc": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    try:
        async with (
            openenv_server(
                environment="session_state",
                dataset=str(DATA),
                verifier=server.address,
                port=0,
                max_steps=10 * args.steps,
                say=lambda line: log("serving", line=line),
            ) as served,
            await Client.connect(verifier=server.address) as client,
        ):
            for n in range(args.trials):
                job = {"reset": {"index": 0}, "action": ACTION}
                mine = time.process_time()
                own = await own_client(python, "time", served.url, job, "--steps", str(args.steps))
                wall["served"].append(own["seconds"] * 1e6 / own["steps"])
                # this process's CPU over the client's whole run (its start-up and reset included:
                # an upper bound on the server side's CPU per step)
                cpu["served"].append((time.process_time() - mine) * 1e6 / own["steps"])

                sid = f"grpc-{n}"
                await client.verifier.seed_session("session_state", ROW, session_id=sid)
                await client.verifier.call_tool(sid, "get_counter_value", {})
                start, mine = time.perf_counter(), time.process_time()
                for _ in range(args.steps):
                    await client.verifier.call_tool(sid, "get_counter_value", {})
                wall["verifier_grpc"].append((time.perf_counter() - start) * 1e6 / args.steps)
                cpu["verifier_grpc"].append((time.process_time() - mine) * 1e6 / args.steps)
                await client.verifier.close_session(sid)
                log("trial", n=n, **{k: round(v[-1], 1) for k, v in wall.items()})
    finally:
        await server.stop(grace=0)
        await svc.aclose()
    load_after = os.getloadavg()

    def ratio(table: dict[str, list[float]]) -> float:
        return round(statistics.fmean(table["served"]) / statistics.fmean(table["verifier_grpc"]), 3)

    result = {
        "name": "openenv_serve",
        "params": {"trials": args.trials, "steps": args.steps, "environment": "session_state (a tool call)"},
        "figures": {
            **step_figures(wall, cpu, "process_cpu"),
            "served_over_verifier_grpc": {"wall": ratio(wall), "process_cpu": ratio(cpu)},
        },
        "load": {"loadavg_1_5_15_before": load_before, "loadavg_1_5_15_after": load_after},
        **env_info("fastapi", "uvicorn", "grpcio"),
    }
    out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
