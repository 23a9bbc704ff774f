"""The artifact registry: named artifacts across ordered roots."""

from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry.catalog import Catalog, Kind, Listed, Resolved, validate_name
from rollmesh.registry.config import RegistryConfig
from rollmesh.registry.errors import ArtifactCollision, ArtifactNotFound, BadArtifactName, UnknownKind
from rollmesh.registry.roots import BUILTIN_ROOT, Root, RootsConfig, install_sys_path, ordered_roots


def binding(catalog: Catalog) -> ServiceBinding:
    """The registry's servicer, ready for `mesh.build_server`."""
    from rollmesh.registry.servicer import RegistryServicer
    from rollmesh_client.v1 import registry_pb2, registry_pb2_grpc

    return ServiceBinding.of(registry_pb2, registry_pb2_grpc, "ArtifactRegistry", RegistryServicer(catalog))


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
    "binding",
    "install_sys_path",
    "ordered_roots",
    "validate_name",
]
