"""UpdateWeights through the gRPC door: the SDK's `gateway.update_weights` and the CLI's
`rollmesh models update-weights` against a ModelGateway server (FakeBackend serving a checkpoint
folder) on loopback; errors arrive with their reasons."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh_client import Client
from rollmesh_client import RollmeshClientError
from tests.conftest import StartServer
from tests.procs import run_cli
from tests.unit.test_gateway_update_weights import new_weights_upper
from tests.unit.test_gateway_update_weights import write_checkpoint

USER = [{"role": "user", "content": "what is 5+7?"}]


class Mesh:
    def __init__(self, client: Client, backend: FakeBackend, address: str, root: Path) -> None:
        self.client, self.backend, self.address, self.root = client, backend, address, root


@pytest_asyncio.fixture
async def mesh(start_server: StartServer, tmp_path: Path) -> AsyncIterator[Mesh]:
    backend = FakeBackend("tiny", num_replicas=2, weights_dir=write_checkpoint(tmp_path / "served"))
    gateway = Gateway([backend])
    await gateway.start()
    server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    client = await Client.connect(gateway=server.address, timeout_s=30)
    try:
        yield Mesh(client, backend, server.address, tmp_path)
    finally:
        await client.close()
        await gateway.shutdown()


async def test_sdk_update_then_generations_carry_the_new_version(mesh: Mesh) -> None:
    new = write_checkpoint(mesh.root / "step1", scale=3.0)
    resp = await mesh.client.gateway.update_weights(new)
    assert (resp.policy_version, resp.previous_version, resp.tensors) == ("1", "0", 3)
    assert sorted(resp.replica_ids) == ["tiny-replica-0", "tiny-replica-1"]
    assert resp.checkpoint_path == str(new) and resp.retried_requests == 0
    r = await mesh.client.gateway.generate(USER)
    assert r.policy_version == "1"
    models = [m async for m in mesh.client.gateway.models()]
    assert models[0].policy_version == "1"


async def test_sdk_abort_and_retry_reruns_a_running_generation(mesh: Mesh) -> None:
    mesh.backend.token_latency_s = 60
    running = asyncio.create_task(mesh.client.gateway.generate(USER, request_id="long", timeout_s=60))
    await mesh.backend.wait_running("long")

    def fast(replica: str, checkpoint: Path) -> None:
        mesh.backend.token_latency_s = 0.0

    mesh.backend.weight_load_hook = fast
    resp = await mesh.client.gateway.update_weights(
        write_checkpoint(mesh.root / "step1"), in_flight="abort_and_retry", policy_version="v2"
    )
    assert resp.retried_requests == 1
    r = await running
    assert (r.finish_reason, r.policy_version) == ("stop", "v2")


async def test_sdk_errors_carry_reasons(mesh: Mesh) -> None:
    with pytest.raises(RollmeshClientError) as info:
        await mesh.client.gateway.update_weights(write_checkpoint(mesh.root / "bad", drop="norm.weight"))
    assert (info.value.code, info.value.reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "CHECKPOINT_INCOMPATIBLE",
    )
    assert "tensor norm.weight is missing" in info.value.message
    with pytest.raises(RollmeshClientError) as info:
        await mesh.client.gateway.update_weights(mesh.root / "nowhere" / "ckpt")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "neither a folder" in info.value.message

    def broken(replica: str, checkpoint: Path) -> None:
        raise RuntimeError(f"{replica} out of memory")

    mesh.backend.weight_load_hook = broken
    with pytest.raises(RollmeshClientError) as info:
        await mesh.client.gateway.update_weights(write_checkpoint(mesh.root / "ok"))
    assert (info.value.code, info.value.reason) == (grpc.StatusCode.ABORTED, "WEIGHT_LOAD_FAILED")
    assert (await mesh.client.gateway.generate(USER)).policy_version == "0"


async def test_cli_update_weights(mesh: Mesh) -> None:
    new = write_checkpoint(mesh.root / "cli")
    code, out, err = await run_cli(
        "models", "update-weights", str(new), "--version", "5", "--json", "--gateway", mesh.address
    )
    assert code == 0, err
    assert json.loads(out)["policy_version"] == "5"
    code, out, err = await run_cli(
        "models", "update-weights", str(new), "--abort-in-flight", "--gateway", mesh.address
    )
    assert code == 0, err
    assert "policy version 5 -> 6: 3 tensors" in out and "into 2 replicas" in out
    code, out, err = await run_cli(
        "models",
        "update-weights",
        str(write_checkpoint(mesh.root / "bad", shape=("norm.weight", (5,)))),
        "--gateway",
        mesh.address,
    )
    assert code != 0 and "CHECKPOINT_INCOMPATIBLE" in err and "norm.weight has shape [5]" in err


async def test_cli_models_list_shows_each_replicas_weights(mesh: Mesh) -> None:
    code, out, err = await run_cli("models", "list", "--gateway", mesh.address, env={"COLUMNS": "400"})
    assert code == 0, err
    assert "tiny-replica-0: 0 running, 0 sess." in out and "weights" not in out
    new = write_checkpoint(mesh.root / "step7")
    code, _, err = await run_cli(
        "models", "update-weights", str(new), "--version", "7", "--gateway", mesh.address
    )
    assert code == 0, err
    code, out, err = await run_cli("models", "list", "--gateway", mesh.address, env={"COLUMNS": "400"})
    assert code == 0, err
    for replica in ("tiny-replica-0", "tiny-replica-1"):
        assert f"{replica}: 0 running, 0 sess., weights step7 (policy 7)" in out, out
    code, out, err = await run_cli("models", "list", "--json", "--gateway", mesh.address)
    assert code == 0, err
    replicas = json.loads(out)[0]["replicas"]
    assert [(r["weights_id"], r["policy_version"]) for r in replicas] == [("step7", "7")] * 2


class StallsAfterTwo(FakeBackend):
    """Produces two ids, then waits 60 s per id (until a weight load makes it fast again)."""

    async def generate(self, request: Any) -> Any:
        n = 0
        async for chunk in super().generate(request):
            n += len(chunk.token_ids)
            if n == 2 and not self.weight_loads:
                self.token_latency_s = 60
            yield chunk


async def test_sdk_continue_answers_one_generation_of_two_versions(
    start_server: StartServer, tmp_path: Path
) -> None:
    backend = StallsAfterTwo("tiny", weights_dir=write_checkpoint(tmp_path / "served"))
    backend.script = new_weights_upper(backend)
    gateway = Gateway([backend])
    await gateway.start()
    server = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    async with await Client.connect(gateway=server.address, timeout_s=30) as client:
        running = asyncio.create_task(client.gateway.generate(USER, request_id="p", timeout_s=60))
        await backend.wait_running("p")

        def fast(replica: str, checkpoint: Path) -> None:
            backend.token_latency_s = 0.0

        backend.weight_load_hook = fast
        for _ in range(3000):  # the two old ids are out (bounded: 30 s)
            if backend.token_latency_s == 60:
                break
            await asyncio.sleep(0.01)
        resp = await client.gateway.update_weights(tmp_path / "served", in_flight="continue")
        assert (resp.policy_version, resp.retried_requests) == ("1", 1)
        r = await running
    await gateway.shutdown()
    assert (r.message.content, r.finish_reason, r.policy_version) == ("abCDEF", "stop", "0")
    assert [(v.start, v.end, v.policy_version) for v in r.versions] == [(0, 2, "0"), (2, 7, "1")]
