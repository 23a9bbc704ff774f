"""`python -m rollmesh.verifier`: config -> catalog -> environments -> mesh.serve()."""

from __future__ import annotations

import asyncio

from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import serve
from rollmesh.registry import Catalog, install_sys_path
from rollmesh.verifier import VerifierConfig, binding
from rollmesh.verifier.service import VerifierService


async def _run(cfg: VerifierConfig) -> None:
    assert cfg.roots is not None
    catalog = Catalog.from_config(cfg.roots)
    install_sys_path(catalog.roots)
    service = await asyncio.to_thread(VerifierService.from_catalog, cfg, catalog)
    await service.start()
    try:
        await serve([binding(service)], cfg.server)
    finally:
        await service.aclose()


def main(port: int | None = None, host: str | None = None) -> None:
    configure()
    cfg = VerifierConfig.from_env(port=port, host=host)
    asyncio.run(_run(cfg))


if __name__ == "__main__":
    main()
