"""Registry configuration, read once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rollmesh.mesh.config import ServerConfig
from rollmesh.registry.roots import RootsConfig


@dataclass(frozen=True)
class RegistryConfig:
    server: ServerConfig
    roots: RootsConfig

    @classmethod
    def from_env(
        cls, *, port: int | None = None, host: str | None = None, environ: Mapping[str, str] | None = None
    ) -> RegistryConfig:
        return cls(
            server=ServerConfig.from_env("registry", port=port, host=host, environ=environ),
            roots=RootsConfig.from_env(environ),
        )
