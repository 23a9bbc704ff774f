"""Scheduler configuration, read once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rollmesh.mesh import config
from rollmesh.mesh.config import ServerConfig
from rollmesh.registry import RootsConfig


@dataclass(frozen=True)
class SchedulerConfig:
    server: ServerConfig
    roots: RootsConfig
    gateway_addr: str
    verifier_addr: str
    output_dir: str = "runs"

    @classmethod
    def from_env(
        cls,
        *,
        port: int | None = None,
        host: str | None = None,
        output_dir: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> SchedulerConfig:
        return cls(
            server=ServerConfig.from_env("scheduler", port=port, host=host, environ=environ),
            roots=RootsConfig.from_env(environ),
            gateway_addr=config.service_addr("gateway", environ),
            verifier_addr=config.service_addr("verifier", environ),
            output_dir=output_dir or "runs",
        )
