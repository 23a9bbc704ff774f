"""Scheduler configuration, read once."""

from __future__ import annotations

from dataclasses import dataclass

from rollmesh.mesh import config
from rollmesh.mesh.config import NO_FLAGS
from rollmesh.mesh.config import ServerConfig
from rollmesh.mesh.config import ServerFlags
from rollmesh.registry import RootsConfig
from rollmesh.scheduler import DEFAULT_OUTPUT_DIR


@dataclass(frozen=True)
class SchedulerConfig:
    server: ServerConfig
    roots: RootsConfig
    gateway_addr: str
    verifier_addr: str
    output_dir: str = DEFAULT_OUTPUT_DIR

    @classmethod
    def from_env(cls, flags: ServerFlags = NO_FLAGS, output_dir: str | None = None) -> SchedulerConfig:
        return cls(
            server=ServerConfig.from_env("scheduler", flags),
            roots=RootsConfig.from_env(),
            gateway_addr=config.service_addr("gateway"),
            verifier_addr=config.service_addr("verifier"),
            output_dir=output_dir or DEFAULT_OUTPUT_DIR,
        )
