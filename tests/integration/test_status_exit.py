"""`rollmesh status` exits non-zero when it cannot read a service, not only when one is down: a
mesh with ROLLMESH_API_KEY set, asked without the key (or with a wrong one), is not usable."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.registry.servicer import RegistryServicer
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.servicer import SchedulerServicer
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.conftest import StartServer
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.procs import run_cli

KEY = "s3cret-key"


@pytest_asyncio.fixture
async def keyed_address(start_server: StartServer) -> AsyncIterator[str]:
    """One server with the four real services (a fake model backend), bearer-token protected."""
    catalog = Catalog([Root(BUILTIN_ROOT, 0, "root")])
    verifier = VerifierService.from_catalog(VerifierConfig(), catalog, entry_points=False)
    await verifier.start()
    manager = JobManager(catalog, model=LocalModel(), env=LocalEnv())
    bindings = [
        ServiceBinding.of(RegistryServicer(catalog)),
        ServiceBinding.of(VerifierServicer(verifier)),
        ServiceBinding.of(GatewayServicer(Gateway([FakeBackend("tiny")]))),
        ServiceBinding.of(SchedulerServicer(manager)),
    ]
    try:
        server = await start_server(bindings, api_key=KEY)
        yield server.address
    finally:
        await manager.aclose()
        await verifier.aclose()


def _args(addr: str, *extra: str) -> list[str]:
    return ["status", "--registry", addr, "--verifier", addr, "--gateway", addr, "--scheduler", addr, *extra]


async def test_status_without_the_key_exits_1_and_says_why(keyed_address: str) -> None:
    env = {"ROLLMESH_API_KEY": ""}
    code, _, err = await run_cli(*_args(keyed_address), env=env)
    assert code == 1, err
    assert "cannot read: registry, verifier, gateway, scheduler" in err and "api-key" in err
    code, out, _ = await run_cli(*_args(keyed_address, "--json", "--api-key", "wrong"), env=env)
    assert code == 1
    rows = json.loads(out)
    assert [r["ok"] for r in rows] == [False] * 4
    assert all(r["health"] == "SERVING" and "UNAUTHENTICATED" in r["detail"] for r in rows)


async def test_status_with_the_key_exits_0(keyed_address: str) -> None:
    code, out, err = await run_cli(
        *_args(keyed_address, "--json", "--api-key", KEY), env={"ROLLMESH_API_KEY": ""}
    )
    assert code == 0, err + out
    assert [r["ok"] for r in json.loads(out)] == [True] * 4
