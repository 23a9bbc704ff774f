"""The artifact registry: named artifacts across ordered roots."""

from rollmesh.registry.catalog import Catalog
from rollmesh.registry.catalog import Kind
from rollmesh.registry.errors import ArtifactCollision
from rollmesh.registry.errors import ArtifactNotFound
from rollmesh.registry.errors import BadArtifactName
from rollmesh.registry.errors import UnknownKind
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.registry.roots import Root
from rollmesh.registry.roots import RootsConfig
from rollmesh.registry.roots import install_sys_path
from rollmesh.registry.roots import ordered_roots

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
