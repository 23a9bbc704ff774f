"""`python -m rollmesh.gateway`: config -> backends -> Gateway -> mesh.serve() (+ the HTTP facade)."""

from __future__ import annotations

from typing import Any

from rollmesh.gateway import Gateway
from rollmesh.gateway import GatewayConfig
from rollmesh.gateway.backends.factory import create_backend
from rollmesh.gateway.http import HttpFacade
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.aio import run_server
from rollmesh.mesh.config import NO_FLAGS
from rollmesh.mesh.config import ServerFlags
from rollmesh.mesh.logging import configure
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.server import MeshServer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import refuse_a_taken_port
from rollmesh.mesh.server import serve

log = get_logger("rollmesh.gateway")


async def run(cfg: GatewayConfig) -> None:
    """Serve until SIGTERM/SIGINT: start the backends, the gRPC server and the HTTP facade; on stop,
    drain gRPC, stop HTTP, then shut the backends down."""
    if cfg.http_port > 0:  # before anything starts: a taken port is one line, not a half-started gateway
        refuse_a_taken_port(
            f"{cfg.http_host}:{cfg.http_port}", "the OpenAI HTTP facade", "--http-port 0 picks a free one"
        )
    gateway = Gateway([create_backend(s) for s in cfg.models], cfg, backend_factory=create_backend)
    await gateway.start()
    http = HttpFacade(gateway, host=cfg.http_host, port=cfg.http_port, api_key=cfg.server.api_key)

    async def started(server: MeshServer) -> None:
        if cfg.http_port >= 0:
            await http.start()
        log.info(
            "gateway_ready",
            grpc=server.address,
            http=http.base_url if cfg.http_port >= 0 else "off",
            models=[s.name for s in cfg.models],
            default_model=cfg.default_model,
        )

    stopped = False

    async def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        try:
            await http.stop()
        finally:
            await gateway.shutdown()

    try:
        await serve(
            [ServiceBinding.of(GatewayServicer(gateway))], cfg.server, on_started=started, on_stop=stop
        )
    except BaseException:
        await stop()
        raise


def main(flags: ServerFlags = NO_FLAGS, **options: Any) -> None:
    """`flags` and `options` (the CLI's: http_port, backend, model, replicas, base_url) override the
    environment, as `GatewayConfig.from_env` takes them."""
    configure()
    cfg = GatewayConfig.from_env(flags, **options)
    # Ray Serve's handles run in this process with that backend: only asyncio is tested with them.
    run_server(
        run(cfg),
        event_loop=cfg.server.event_loop,
        uvloop_ok=all(m.backend != "ray-serve" for m in cfg.models),
    )


if __name__ == "__main__":
    main()
