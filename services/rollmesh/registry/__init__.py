"""The artifact registry: named artifacts across ordered roots."""

from rollmesh.registry.catalog import Catalog, Kind
from rollmesh.registry.errors import ArtifactCollision, ArtifactNotFound, BadArtifactName, UnknownKind
from rollmesh.registry.roots import BUILTIN_ROOT, Root, RootsConfig, install_sys_path, ordered_roots

__all__ = [
    "BUILTIN_ROOT",
    "ArtifactCollision",
    "ArtifactNotFound",
    "BadArtifactName",
    "Catalog",
    "Kind",
    "Root",
    "RootsConfig",
    "UnknownKind",
    "install_sys_path",
    "ordered_roots",
]
