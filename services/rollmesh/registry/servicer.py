"""The ArtifactRegistry grpc.aio servicer: proto in, catalog call, proto out."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rollmesh.mesh.paging import page
from rollmesh.registry import convert
from rollmesh.registry.catalog import Catalog
from rollmesh.registry.catalog import read_chunks
from rollmesh_client.v1 import registry_pb2 as pb
from rollmesh_client.v1 import registry_pb2_grpc as pb_grpc

MIN_CHUNK, DEFAULT_CHUNK, MAX_CHUNK = 16 * 1024, 256 * 1024, 1024 * 1024


class RegistryServicer(pb_grpc.ArtifactRegistryServicer):
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    async def ListRoots(self, request: pb.ListRootsRequest, context: Any) -> pb.ListRootsResponse:
        return pb.ListRootsResponse(
            roots=[convert.root_to_pb(r) for r in self._catalog.roots],
            allow_override=self._catalog.allow_override,
        )

    async def ListArtifacts(self, request: pb.ListArtifactsRequest, context: Any) -> pb.ListArtifactsResponse:
        unspecified = request.kind == pb.ARTIFACT_KIND_UNSPECIFIED
        kind = None if unspecified else convert.kind_from_pb(request.kind)
        rows = await asyncio.to_thread(self._catalog.list_artifacts, kind)
        items, token = page(rows, request.page_size, request.page_token)
        return pb.ListArtifactsResponse(
            artifacts=[convert.listed_to_pb(r) for r in items], next_page_token=token
        )

    async def ResolveArtifact(
        self, request: pb.ResolveArtifactRequest, context: Any
    ) -> pb.ResolveArtifactResponse:
        kind = convert.kind_from_pb(request.kind)
        resolved = await asyncio.to_thread(self._catalog.resolve, kind, request.name)
        return pb.ResolveArtifactResponse(artifact=convert.resolved_to_pb(resolved))

    async def ReadArtifact(
        self, request: pb.ReadArtifactRequest, context: Any
    ) -> AsyncIterator[pb.ReadArtifactResponse]:
        kind = convert.kind_from_pb(request.kind)
        chunk = min(max(request.chunk_size or DEFAULT_CHUNK, MIN_CHUNK), MAX_CHUNK)
        resolved = await asyncio.to_thread(self._catalog.resolve, kind, request.name)
        if request.file:
            path = await asyncio.to_thread(self._catalog.file_in, resolved, request.file)
            files: list[tuple[str, Path]] = [(request.file, path)]
        elif resolved.is_dir:
            files = [(rel, resolved.path / rel) for rel in resolved.files]
        else:
            files = [("", resolved.path)]
        header: pb.Artifact | None = convert.resolved_to_pb(resolved)
        for rel, path in files:
            digest = hashlib.sha256()
            chunks = read_chunks(path, chunk)
            pending: tuple[int, bytes] | None = await asyncio.to_thread(next, chunks, None)
            if pending is None:  # an empty file still gets one message
                pending = (0, b"")
            while pending is not None:
                offset, data = pending
                digest.update(data)
                pending = await asyncio.to_thread(next, chunks, None)
                msg = pb.ReadArtifactResponse(relative_path=rel, offset=offset, data=data)
                if pending is None:
                    msg.file_sha256 = digest.hexdigest()
                if header is not None:
                    msg.artifact.CopyFrom(header)
                    header = None
                yield msg
