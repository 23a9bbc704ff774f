"""`python -m rollmesh.registry`: config -> catalog -> mesh.serve()."""

from __future__ import annotations

from rollmesh.mesh.aio import run_server
from rollmesh.mesh.config import ServerConfig
from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import ServiceBinding, serve
from rollmesh.registry import Catalog, RootsConfig, install_sys_path
from rollmesh.registry.servicer import RegistryServicer


def main(port: int | None = None, host: str | None = None, metrics_port: int | None = None) -> None:
    configure()
    server = ServerConfig.from_env("registry", port=port, host=host, metrics_port=metrics_port)
    catalog = Catalog.from_config(RootsConfig.from_env())
    install_sys_path(catalog.roots)
    run_server(serve([ServiceBinding.of(RegistryServicer(catalog))], server), event_loop=server.event_loop)


if __name__ == "__main__":
    main()
