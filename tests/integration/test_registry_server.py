"""A real registry server on loopback, driven by the SDK: listing, resolving, streaming, errors, auth."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.servicer import RegistryServicer
from rollmesh_client import Client
from rollmesh_client import FailedPreconditionError
from rollmesh_client import InvalidArgumentError
from rollmesh_client import NotFoundError
from rollmesh_client import UnauthenticatedError
from rollmesh_client.v1 import registry_pb2 as pb
from rollmesh_client.v1 import registry_pb2_grpc as pb_grpc
from tests.conftest import StartServer


def build_roots(tmp_path: Path) -> RootsConfig:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        (root / "datasets").mkdir(parents=True)
    (a / "datasets" / "dup.jsonl").write_text('{"x": 1}\n')
    (b / "datasets" / "dup.jsonl").write_text('{"x": 2}\n')
    for i in range(5):
        (b / "datasets" / f"d{i}.jsonl").write_text(f'{{"i": {i}}}\n')
    big = b / "models" / "m"
    big.mkdir(parents=True)
    (big / "weights.bin").write_bytes(bytes(range(256)) * 2000)  # 512,000 bytes: several chunks
    (big / "config.json").write_text("{}")
    (big / "empty.txt").write_text("")
    return RootsConfig(cwd=tmp_path / "nowhere", extra=(a,), root=b, allow_override=False)


async def test_list_resolve_read_and_collision(tmp_path: Path, start_server: StartServer) -> None:
    server = await start_server(
        [ServiceBinding.of(RegistryServicer(Catalog.from_config(build_roots(tmp_path))))]
    )
    async with await Client.connect(registry=server.address) as c:
        roots = await c.registry.roots()
        assert [r.source for r in roots.roots] == ["extra", "root"] and not roots.allow_override

        names = [a.name async for a in c.registry.artifacts("dataset", page_size=2)]
        assert names == ["d0", "d1", "d2", "d3", "d4", "dup"]  # six items over three pages
        (dup,) = [a async for a in c.registry.artifacts("dataset") if a.name == "dup"]
        assert dup.collides_with == [str(tmp_path / "b" / "datasets" / "dup.jsonl")]

        art = await c.registry.resolve("dataset", "d3")
        assert art.sha256 == hashlib.sha256(b'{"i": 3}\n').hexdigest() and art.size_bytes == 9

        with pytest.raises(FailedPreconditionError) as coll:
            await c.registry.resolve("dataset", "dup")
        assert coll.value.reason == "ARTIFACT_COLLISION"
        assert str(tmp_path / "a" / "datasets" / "dup.jsonl") in coll.value.message
        assert str(tmp_path / "b" / "datasets" / "dup.jsonl") in coll.value.metadata.values()

        with pytest.raises(NotFoundError) as nf:
            await c.registry.resolve("dataset", "missing")
        assert nf.value.reason == "ARTIFACT_NOT_FOUND"
        with pytest.raises(InvalidArgumentError) as bad:
            await c.registry.resolve("dataset", "../../etc/passwd")
        assert bad.value.reason == "BAD_ARTIFACT_NAME" and "path separator" in bad.value.message

        dest = tmp_path / "copy"
        model = await c.registry.download("model", "m", dest)
        assert model.is_dir and list(model.files) == ["config.json", "empty.txt", "weights.bin"]
        assert (dest / "weights.bin").read_bytes() == (tmp_path / "b/models/m/weights.bin").read_bytes()
        assert (dest / "empty.txt").read_bytes() == b""

        chunks = [m async for m in c.registry.read("model", "m", file="weights.bin")]
        assert len(chunks) == 2 and chunks[0].HasField("artifact") and not chunks[1].HasField("artifact")
        assert chunks[-1].file_sha256 == hashlib.sha256(bytes(range(256)) * 2000).hexdigest()


async def test_unknown_kind_and_bad_page_token(tmp_path: Path, start_server: StartServer) -> None:
    server = await start_server(
        [ServiceBinding.of(RegistryServicer(Catalog.from_config(build_roots(tmp_path))))]
    )
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = pb_grpc.ArtifactRegistryStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ResolveArtifact(pb.ResolveArtifactRequest(kind=0, name="x"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as tok:
            await stub.ListArtifacts(pb.ListArtifactsRequest(page_token="garbage"))
        assert tok.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        resp = await stub.ListArtifacts(pb.ListArtifactsRequest(page_size=100000))
        assert len(resp.artifacts) == 7 and resp.next_page_token == ""


async def test_bearer_auth_exempts_health_and_reflection(tmp_path: Path, start_server: StartServer) -> None:
    server = await start_server(
        [ServiceBinding.of(RegistryServicer(Catalog.from_config(build_roots(tmp_path))))], api_key="s3cret"
    )
    async with await Client.connect(registry=server.address, api_key="wrong") as bad:
        with pytest.raises(UnauthenticatedError) as info:
            await bad.registry.roots()
        assert info.value.reason == "UNAUTHENTICATED"
    async with await Client.connect(registry=server.address, api_key="") as anon:
        with pytest.raises(UnauthenticatedError):
            _ = [a async for a in anon.registry.read("dataset", "d0")]
    async with await Client.connect(registry=server.address, api_key="s3cret") as good:
        assert len((await good.registry.roots()).roots) == 2
    async with grpc.aio.insecure_channel(server.address) as ch:
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_graceful_stop_flips_health_to_not_serving(tmp_path: Path, start_server: StartServer) -> None:
    server = await start_server(
        [ServiceBinding.of(RegistryServicer(Catalog.from_config(build_roots(tmp_path))))]
    )
    async with grpc.aio.insecure_channel(server.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        await server.health.enter_graceful_shutdown()
        resp = await stub.Check(health_pb2.HealthCheckRequest(service="rollmesh.v1.ArtifactRegistry"))
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
