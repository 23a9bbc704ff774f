"""`python -m rollmesh.registry`: config -> catalog -> mesh.serve()."""

from __future__ import annotations

from rollmesh.mesh.aio import run_server
from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import serve
from rollmesh.registry import Catalog, RegistryConfig, binding, install_sys_path


def main(port: int | None = None, host: str | None = None) -> None:
    configure()
    cfg = RegistryConfig.from_env(port=port, host=host)
    catalog = Catalog.from_config(cfg.roots)
    install_sys_path(catalog.roots)
    run_server(serve([binding(catalog)], cfg.server), event_loop=cfg.server.event_loop)


if __name__ == "__main__":
    main()
