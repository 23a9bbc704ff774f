"""The artifact registry: named artifacts across ordered roots."""

from rollmesh.registry.catalog import Catalog, Kind, Listed, Resolved, validate_name
from rollmesh.registry.config import RegistryConfig
from rollmesh.registry.errors import ArtifactCollision, ArtifactNotFound, BadArtifactName, UnknownKind
from rollmesh.registry.roots import BUILTIN_ROOT, Root, RootsConfig, install_sys_path, ordered_roots

__all__ = [
    "BUILTIN_ROOT",
    "ArtifactCollision",
    "ArtifactNotFound",
    "BadArtifactName",
    "Catalog",
    "Kind",
    "Listed",
    "RegistryConfig",
    "Resolved",
    "Root",
    "RootsConfig",
    "UnknownKind",
    "install_sys_path",
    "ordered_roots",
    "validate_name",
]
