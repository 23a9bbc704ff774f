"""Proto <-> domain conversions for the registry (the only module here that sees *_pb2)."""

from __future__ import annotations

from rollmesh.mesh.fields import to_pb
from rollmesh.registry.catalog import Kind
from rollmesh.registry.catalog import Listed
from rollmesh.registry.catalog import Resolved
from rollmesh.registry.errors import UnknownKind
from rollmesh.registry.roots import Root
from rollmesh_client.v1 import registry_pb2 as pb

_KIND_TO_PB = {k: pb.ArtifactKind.Value(f"ARTIFACT_KIND_{k.name}") for k in Kind}
_PB_TO_KIND = {v: k for k, v in _KIND_TO_PB.items()}


def kind_from_pb(value: int) -> Kind:
    try:
        return _PB_TO_KIND[pb.ArtifactKind.ValueType(value)]
    except KeyError:
        names = ", ".join(pb.ArtifactKind.Name(v) for v in _PB_TO_KIND)
        raise UnknownKind(f"artifact kind {value} is not one of {names}") from None


def root_to_pb(root: Root) -> pb.Root:
    return pb.Root(path=str(root.path), order=root.order, source=root.source)


def listed_to_pb(item: Listed) -> pb.ListedArtifact:
    return to_pb(
        pb.ListedArtifact,
        item,
        kind=_KIND_TO_PB[item.kind],
        path=str(item.path),
        root=str(item.root),
        collides_with=[str(p) for p in item.collides_with],
    )


def resolved_to_pb(item: Resolved) -> pb.Artifact:
    return to_pb(pb.Artifact, item, kind=_KIND_TO_PB[item.kind], path=str(item.path), root=str(item.root))
