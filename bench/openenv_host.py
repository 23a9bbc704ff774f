"""The OpenEnv host bridge's cost per step (verifier/bridges/openenv_env.py) against OpenEnv's own
client on the same server, in the same run: one WebSocket episode of N steps each way, on `openenv
init`'s template (an echo: the action is the text) served by the verifier in the OpenEnv virtualenv.

- `bridge`: the verifier's domain layer (VerifierService.step: the action built from the turn, the
  answer checked, the observation made a message), in this process.
- `bridge_grpc`: the same through the verifier's gRPC Step (the SDK on loopback), what the scheduler
  pays.
- `openenv_client`: OpenEnv's `GenericEnvClient` (tests/openenv_envs/own_client.py) in the OpenEnv
  interpreter, timed inside its own process (its start-up left out).

Prints ONE JSON object to stdout (logs go to stderr): wall µs per step and client CPU µs per step
(this process's; for `bridge_grpc` that is the SDK and the verifier's gRPC server together, both here),
mean ± stddev over trials (the three alternate, so drift in the machine's load hits all alike), the
ratios, and the load average before and after (the machine is shared).

    .venv/bin/python bench/openenv_host.py [--trials 5] [--steps 500]

Needs the OpenEnv virtualenv (scripts/openenv_venv.py: built once, cached).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._meta import env_info
from bench._meta import load_script
from bench._meta import log
from bench._meta import result_stream
from bench._meta import step_figures
from bench._meta import trial_args
from rollmesh.mesh.chat import Message
from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import Response
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.openenv_env import OpenEnvEnvironment
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import Client
from tests.openenv_servers import init_template
from tests.openenv_servers import own_client

TEXT = "hello, environment"
ROW = json.dumps({"responses_create_params": {"input": []}})


async def timed(step: Callable[[], Awaitable[Any]], n: int) -> tuple[float, float]:
    """Wall and this process's CPU µs per step over `n` sequential steps (after one warm-up)."""
    await step()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await step()
    return (time.perf_counter() - start) * 1e6 / n, (time.process_time() - cpu) * 1e6 / n


async def main() -> None:
    args = trial_args(__doc__)
    out = result_stream()
    configure(level="warning")
    python = Path(load_script("openenv_venv").venv())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = init_template(python, Path(tmp) / "envs")
        folder = Path(tmp) / "root" / "environments" / "echo"
        folder.mkdir(parents=True)
        (folder / "openenv.toml").write_text(f'env_dir = "{env_dir}"\npython = "{python}"\n')
        roots = RootsConfig(Path("/nonexistent"), (Path(tmp) / "root",), BUILTIN_ROOT, False)
        svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
        await svc.start()
        server = await build_server([ServiceBinding.of(VerifierServicer(svc))], "127.0.0.1:0", api_key="")
        await server.start()
        await wait_serving(server.address, timeout_s=60)
        env = svc.environment("echo")
        assert isinstance(env, OpenEnvEnvironment) and env.sidecar is not None
        url = f"http://{env.sidecar.address}"
        log("server_up", url=url, isolation=env.sidecar.isolation)
        turn = Response((Message("assistant", TEXT),))
        wall: dict[str, list[float]] = {"bridge": [], "bridge_grpc": [], "openenv_client": []}
        cpu: dict[str, list[float]] = {k: [] for k in wall}
        try:
            async with await Client.connect(verifier=server.address) as client:
                for n in range(args.trials):
                    sid = (await svc.seed_session("echo", ROW)).session.id
                    w, c = await timed(functools.partial(svc.step, sid, turn), args.steps)
                    await svc.close_session(sid)
                    wall["bridge"].append(w)
                    cpu["bridge"].append(c)

                    await client.verifier.seed_session("echo", ROW, session_id=f"grpc-{n}")
                    w, c = await timed(functools.partial(client.verifier.step, f"grpc-{n}", TEXT), args.steps)
                    await client.verifier.close_session(f"grpc-{n}")
                    wall["bridge_grpc"].append(w)
                    cpu["bridge_grpc"].append(c)

                    job = {"action": {"message": TEXT}}
                    own = await own_client(python, "time", url, job, "--steps", str(args.steps))
                    wall["openenv_client"].append(own["seconds"] * 1e6 / own["steps"])
                    cpu["openenv_client"].append(own["cpu_seconds"] * 1e6 / own["steps"])
                    log("trial", n=n, **{k: round(v[-1], 1) for k, v in wall.items()})
        finally:
            await server.stop(grace=0)
            await svc.aclose()
    load_after = os.getloadavg()

    def ratio(table: dict[str, list[float]], what: str) -> float:
        return round(statistics.fmean(table[what]) / statistics.fmean(table["openenv_client"]), 3)

    result = {
        "name": "openenv_host",
        "params": {"trials": args.trials, "steps": args.steps, "environment": "openenv init template (echo)"},
        "figures": {
            **step_figures(wall, cpu, "client_cpu"),
            "over_openenv_client_wall": {k: ratio(wall, k) for k in ("bridge", "bridge_grpc")},
            "over_openenv_client_client_cpu": {k: ratio(cpu, k) for k in ("bridge", "bridge_grpc")},
        },
        "load": {"loadavg_1_5_15_before": load_before, "loadavg_1_5_15_after": load_after},
        **env_info("aiohttp", "grpcio"),
    }
    out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
