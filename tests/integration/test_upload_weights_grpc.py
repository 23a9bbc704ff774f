"""UploadWeights through the gRPC door: the SDK streams a checkpoint (a local folder, or a torch
state dict) to a ModelGateway server (FakeBackend serving a checkpoint folder) on loopback; the
gateway stages it, checks each file's sha256, updates from it, keeps it while it is served and
deletes it after; bad uploads fail with their reasons and leave nothing behind."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file

from rollmesh.gateway import Gateway
from rollmesh.gateway import GatewayConfig
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh_client import Client
from rollmesh_client import RollmeshClientError
from rollmesh_client.v1 import gateway_pb2 as pb
from tests.conftest import StartServer
from tests.procs import run_cli
from tests.unit.test_gateway_update_weights import TENSORS
from tests.unit.test_gateway_update_weights import write_checkpoint

USER = [{"role": "user", "content": "what is 5+7?"}]


class Mesh:
    def __init__(self, client: Client, backend: FakeBackend, gateway: Gateway, root: Path) -> None:
        self.client, self.backend, self.gateway, self.root = client, backend, gateway, root

    def staged(self) -> list[Path]:
        root = self.gateway.uploads.root
        return sorted(root.iterdir()) if root.exists() else []


@pytest_asyncio.fixture
async def mesh(start_server: StartServer, tmp_path: Path) -> AsyncIterator[Mesh]:
    backend = FakeBackend("tiny", num_replicas=2, weights_dir=write_checkpoint(tmp_path / "served"))
    gateway = Gateway([backend], GatewayConfig(weights_staging_dir=str(tmp_path / "staging")))
    await gateway.start()
    server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    client = await Client.connect(gateway=server.address, timeout_s=30)
    try:
        yield Mesh(client, backend, gateway, tmp_path)
    finally:
        await client.close()
        await gateway.shutdown()


async def test_a_streamed_folder_is_staged_checked_and_served(mesh: Mesh) -> None:
    new = write_checkpoint(mesh.root / "step1", scale=3.0)
    resp = await mesh.client.gateway.update_weights_from_folder(new, chunk_bytes=7)  # many pieces per file
    assert (resp.policy_version, resp.tensors) == ("1", 3)
    (staged,) = mesh.staged()
    assert resp.checkpoint_path == str(staged) and mesh.backend.weights_path == staged
    assert set(mesh.backend.loaded_weights.values()) == {staged}
    for f in new.iterdir():
        assert (staged / f.name).read_bytes() == f.read_bytes()
    assert (await mesh.client.gateway.generate(USER)).policy_version == "1"


async def test_a_state_dict_upload_replaces_the_previous_upload(mesh: Mesh) -> None:
    first = await mesh.client.gateway.update_weights_from_folder(write_checkpoint(mesh.root / "step1"))
    state = {name: torch.full(shape, 5.0) for name, shape in TENSORS.items()}
    second = await mesh.client.gateway.update_weights_from_state_dict(state, policy_version="7")
    assert second.policy_version == "7"
    (staged,) = mesh.staged()  # the first upload was deleted once the second one served
    assert str(staged) == second.checkpoint_path != first.checkpoint_path
    assert sorted(p.name for p in staged.iterdir()) == ["model.safetensors"]
    loaded = load_file(str(staged / "model.safetensors"))
    assert {n: t.shape for n, t in loaded.items()} == {n: torch.Size(s) for n, s in TENSORS.items()}
    assert all(bool((t == 5.0).all()) for t in loaded.values())
    # An update from a plain folder also retires the served upload (never the plain folder).
    plain = write_checkpoint(mesh.root / "step3")
    await mesh.client.gateway.update_weights(plain)
    assert mesh.staged() == [] and plain.is_dir()


async def test_shutdown_deletes_the_served_upload(mesh: Mesh) -> None:
    await mesh.client.gateway.update_weights_from_folder(write_checkpoint(mesh.root / "step1"))
    assert len(mesh.staged()) == 1
    await mesh.gateway.shutdown()
    assert mesh.staged() == []


async def _raw_upload(mesh: Mesh, requests: list[pb.UploadWeightsRequest]) -> RollmeshClientError:
    async def stream() -> AsyncIterator[pb.UploadWeightsRequest]:
        for r in requests:
            yield r

    with pytest.raises(RollmeshClientError) as info:
        await mesh.client.gateway._unary(mesh.client.gateway.stub.UploadWeights, stream())
    return info.value


def _file(name: str, data: bytes, digest: str = "") -> pb.UploadWeightsRequest:
    return pb.UploadWeightsRequest(
        file_name=name, data=data, sha256=digest or hashlib.sha256(data).hexdigest()
    )


async def test_bad_uploads_fail_with_reasons_and_leave_nothing(mesh: Mesh) -> None:
    head = pb.UploadWeightsRequest(update=pb.UpdateWeightsRequest())
    data = (write_checkpoint(mesh.root / "step1") / "model.safetensors").read_bytes()
    cases = {
        "a wrong digest": ([head, _file("model.safetensors", data, "0" * 64)], "UPLOAD_INVALID", "sha256"),
        "a path for a name": (
            [head, _file("../model.safetensors", data)],
            "UPLOAD_INVALID",
            "plain file name",
        ),
        "no digest": (
            [head, pb.UploadWeightsRequest(file_name="model.safetensors", data=data)],
            "UPLOAD_INVALID",
            "without its sha256",
        ),
        "no head": ([_file("model.safetensors", data)], "", "first message carries `update`"),
        "no file": ([head], "UPLOAD_INVALID", "no file"),
        "a checkpoint path as well": (
            [pb.UploadWeightsRequest(update=pb.UpdateWeightsRequest(checkpoint="/x"))],
            "",
            "no update.checkpoint",
        ),
    }
    for case, (requests, reason, words) in cases.items():
        error = await _raw_upload(mesh, requests)
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT, case
        assert (reason or error.reason) == error.reason and words in str(error), (case, str(error))
        assert mesh.staged() == [], case

    # A checkpoint the served model cannot take: refused by the same check as UpdateWeights.
    bad = write_checkpoint(mesh.root / "bad", drop="norm.weight")
    with pytest.raises(RollmeshClientError) as info:
        await mesh.client.gateway.update_weights_from_folder(bad)
    assert info.value.reason == "CHECKPOINT_INCOMPATIBLE"
    assert mesh.staged() == [] and mesh.backend.weight_loads == 0
    assert [m.policy_version async for m in mesh.client.gateway.models()] == ["0"]


async def test_cli_update_weights_upload(mesh: Mesh) -> None:
    new = write_checkpoint(mesh.root / "cli", scale=2.0)
    address = mesh.client.addresses["gateway"]
    code, out, err = await run_cli(
        "models", "update-weights", str(new), "--upload", "--version", "4", "--json", "--gateway", address
    )
    assert code == 0, err
    (staged,) = mesh.staged()
    assert json.loads(out)["checkpoint_path"] == str(staged)
    assert json.loads(out)["policy_version"] == "4"


async def test_an_empty_folder_is_one_line_exit_2_before_any_call(mesh: Mesh) -> None:
    """An empty folder raised inside the request stream, which grpc turned into a CancelledError
    traceback (exit 1)."""
    (empty := mesh.root / "empty").mkdir()
    address = mesh.client.addresses["gateway"]
    code, _, err = await run_cli("models", "update-weights", str(empty), "--upload", "--gateway", address)
    assert code == 2 and f"error: {empty} holds no files to upload" in " ".join(err.split()), err
    assert "Traceback" not in err
    with pytest.raises(ValueError, match="an upload needs at least one file"):
        await mesh.client.gateway.upload_weights({})
    assert mesh.staged() == [] and mesh.backend.weight_loads == 0
