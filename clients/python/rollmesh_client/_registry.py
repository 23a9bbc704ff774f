"""Typed client for the ArtifactRegistry."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

from rollmesh_client._base import ServiceClient
from rollmesh_client.v1 import registry_pb2 as pb
from rollmesh_client.v1 import registry_pb2_grpc as pb_grpc

KINDS = {
    "environment": pb.ARTIFACT_KIND_ENVIRONMENT,
    "benchmark": pb.ARTIFACT_KIND_BENCHMARK,
    "dataset": pb.ARTIFACT_KIND_DATASET,
    "config": pb.ARTIFACT_KIND_CONFIG,
    "prompt": pb.ARTIFACT_KIND_PROMPT,
    "model": pb.ARTIFACT_KIND_MODEL,
}


def kind_value(kind: str | int) -> pb.ArtifactKind.ValueType:
    """ "dataset", "datasets" or the enum value; unknown names pass through as UNSPECIFIED-free ints."""
    if isinstance(kind, int):
        return pb.ArtifactKind.ValueType(kind)
    key = kind.strip().lower().removesuffix("s")
    if key not in KINDS:
        raise ValueError(f"unknown artifact kind {kind!r}; use one of: {', '.join(KINDS)}")
    return KINDS[key]


class RegistryClient(ServiceClient):
    """`ListRoots`, `ListArtifacts` (paged for you), `ResolveArtifact`, `ReadArtifact`."""

    stub_class = pb_grpc.ArtifactRegistryStub

    async def roots(self) -> pb.ListRootsResponse:
        return await self._unary(self.stub.ListRoots, pb.ListRootsRequest(), idempotent=True)

    async def artifacts(
        self, kind: str | int | None = None, *, page_size: int = 100
    ) -> AsyncIterator[pb.ListedArtifact]:
        """Every artifact (of one kind), following page tokens."""
        kind_v = kind_value(kind) if kind is not None else pb.ARTIFACT_KIND_UNSPECIFIED

        def request(token: str) -> pb.ListArtifactsRequest:
            return pb.ListArtifactsRequest(kind=kind_v, page_size=page_size, page_token=token)

        async for item in self._pages(self.stub.ListArtifacts, request, "artifacts"):
            yield item

    async def resolve(self, kind: str | int, name: str) -> pb.Artifact:
        req = pb.ResolveArtifactRequest(kind=kind_value(kind), name=name)
        resp: pb.ResolveArtifactResponse = await self._unary(self.stub.ResolveArtifact, req, idempotent=True)
        return resp.artifact

    async def read(
        self, kind: str | int, name: str, *, file: str = ""
    ) -> AsyncIterator[pb.ReadArtifactResponse]:
        req = pb.ReadArtifactRequest(kind=kind_value(kind), name=name, file=file)
        async for chunk in self._stream(self.stub.ReadArtifact, req):
            yield chunk

    async def download(self, kind: str | int, name: str, dest: Path) -> pb.Artifact:
        """Copy an artifact to `dest` (a file, or a folder for directory artifacts), checking digests."""
        artifact: pb.Artifact | None = None
        out = None
        digest = hashlib.sha256()
        try:
            async for msg in self.read(kind, name):
                if msg.HasField("artifact"):
                    artifact = msg.artifact
                if msg.offset == 0:
                    if out is not None:
                        out.close()
                    target = dest / msg.relative_path if msg.relative_path else dest
                    target.parent.mkdir(parents=True, exist_ok=True)
                    out = target.open("wb")
                    digest = hashlib.sha256()
                assert out is not None
                out.write(msg.data)
                digest.update(msg.data)
                if msg.file_sha256 and msg.file_sha256 != digest.hexdigest():
                    raise OSError(f"digest mismatch for {name}/{msg.relative_path}")
        finally:
            if out is not None:
                out.close()
        if artifact is None:
            raise OSError(f"ReadArtifact for {name!r} sent no data")
        return artifact
