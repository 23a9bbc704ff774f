"""`python -m rollmesh.scheduler [--port N] [--host H] [--output-dir D]`:
config -> gateway/verifier ports -> JobManager -> mesh.serve().

`--port 0` binds a free port; with ROLLMESH_PORT_FILE set, mesh.serve writes the bound address
there, so a parent process needs no free-port guessing.
"""

from __future__ import annotations

import argparse

from rollmesh.mesh import tracing
from rollmesh.mesh.aio import run_server
from rollmesh.mesh.config import NO_FLAGS
from rollmesh.mesh.config import ServerFlags
from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import serve
from rollmesh.registry import Catalog
from rollmesh.scheduler.config import SchedulerConfig
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.servicer import SchedulerServicer


async def _serve(cfg: SchedulerConfig) -> None:
    tracing.configure("scheduler")  # when the OTEL_* variables ask (mesh/tracing.py)
    model = GatewayModel.connect(cfg.gateway_addr, api_key=cfg.server.api_key or None)
    env = VerifierEnv.connect(cfg.verifier_addr, api_key=cfg.server.api_key or None)
    manager = JobManager(
        Catalog.from_config(cfg.roots),
        model=model,
        env=env,
        output_dir=cfg.output_dir,
        api_key=cfg.server.api_key,
    )

    async def stop() -> None:
        await manager.aclose()
        await model.close()
        await env.close()

    await serve([ServiceBinding.of(SchedulerServicer(manager))], cfg.server, on_stop=stop)


def main(flags: ServerFlags = NO_FLAGS, output_dir: str | None = None) -> None:
    configure()
    cfg = SchedulerConfig.from_env(flags, output_dir)
    run_server(_serve(cfg), event_loop=cfg.server.event_loop)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m rollmesh.scheduler")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--host", default=None)
    ap.add_argument("--output-dir", default=None)
    a = ap.parse_args()
    main(ServerFlags(port=a.port, host=a.host), a.output_dir)
