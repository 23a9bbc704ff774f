"""`python -m rollmesh.verifier`: config -> catalog -> environments -> mesh.serve()."""

from __future__ import annotations

import asyncio

from rollmesh.mesh.aio import run_server
from rollmesh.mesh.config import NO_FLAGS
from rollmesh.mesh.config import ServerFlags
from rollmesh.mesh.logging import configure
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import serve
from rollmesh.registry import Catalog
from rollmesh.registry import install_sys_path
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer


async def _run(cfg: VerifierConfig) -> None:
    assert cfg.roots is not None
    catalog = Catalog.from_config(cfg.roots)
    install_sys_path(catalog.roots)
    service = await asyncio.to_thread(VerifierService.from_catalog, cfg, catalog)
    await service.start()
    try:
        await serve([ServiceBinding.of(VerifierServicer(service))], cfg.server)
    finally:
        await service.aclose()


def main(flags: ServerFlags = NO_FLAGS) -> None:
    configure()
    cfg = VerifierConfig.from_env(flags)
    # Always asyncio: the code sandbox's supervision relies on asyncio's subprocess pipes (uvloop
    # raises on a write to a pipe the child closed, and owns the reply pipe's fd differently).
    run_server(_run(cfg), event_loop="asyncio")


if __name__ == "__main__":
    main()
