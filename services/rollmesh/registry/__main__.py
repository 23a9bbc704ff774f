"""`python -m rollmesh.registry`: config -> catalog -> mesh.serve()."""

from __future__ import annotations

from rollmesh.mesh.aio import run_server
from rollmesh.mesh.config import NO_FLAGS
from rollmesh.mesh.config import ServerConfig
from rollmesh.mesh.config import ServerFlags
from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import serve
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry import install_sys_path
from rollmesh.registry.servicer import RegistryServicer


def main(flags: ServerFlags = NO_FLAGS) -> None:
    configure()
    server = ServerConfig.from_env("registry", flags)
    catalog = Catalog.from_config(RootsConfig.from_env())
    install_sys_path(catalog.roots)
    run_server(serve([ServiceBinding.of(RegistryServicer(catalog))], server), event_loop=server.event_loop)


if __name__ == "__main__":
    main()
