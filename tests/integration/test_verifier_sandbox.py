"""Hostile code in the `code` environment: each attempt is contained, scores 0, and the service
stays healthy (Health is checked after every one)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rollmesh.mesh.server import MeshServer, ServiceBinding
from rollmesh.registry import Catalog, RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import SandboxConfig, SandboxLimits, VerifierConfig
from rollmesh.verifier.sandbox import Sandbox, TestSpec
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import Client, aio_channel

StartServer = Callable[..., Awaitable[MeshServer]]
LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=256, nproc=16, fsize_mb=1, output_kb=16)
SECRET = "sekrit-api-key-for-the-sandbox-test"
ADD_TESTS = ["assert add(2, 2) == 4"]


@pytest.fixture
async def code_verifier(
    start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Client, MeshServer, VerifierService]]:
    monkeypatch.setenv("ROLLMESH_API_KEY", SECRET)  # in the service's environment; must not leak
    cfg = VerifierConfig(sandbox=SandboxConfig(concurrency=2, limits=LIMITS))
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(cfg, Catalog.from_config(roots), entry_points=False)
    await svc.start()
    server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
    client = await Client.connect(verifier=server.address, timeout_s=30)
    try:
        yield client, server, svc
    finally:
        await client.close()
        await svc.aclose()


async def healthy(address: str) -> bool:
    async with aio_channel(address) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def code_task(tests: list[str]) -> dict[str, object]:
    return {"verifier_metadata": {"tests": tests}}


HOSTILE = {
    "infinite_loop": ("def add(a, b):\n    while True:\n        pass\n", ADD_TESTS),
    "fork_bomb": (
        "import os\nwhile True:\n    os.fork()\ndef add(a, b): return a + b\n",
        ADD_TESTS,
    ),
    "memory_hog": ("blob = bytearray(2 * 1024**3)\ndef add(a, b): return a + b\n", ADD_TESTS),
    "huge_output": ("while True:\n    print('x' * 100000)\n", ADD_TESTS),
    "write_outside": (
        "def add(a, b):\n    open('/tmp/rollmesh_sandbox_escape', 'w').write('pwned')\n    return a + b\n",
        ADD_TESTS,
    ),
    "read_passwd": ("data = open('/etc/passwd').read()\ndef add(a, b): return a + b\n", ADD_TESTS),
    "read_env": (
        "import os\ndef add(a, b): return a + b\n",
        [f"assert os.environ.get('ROLLMESH_API_KEY') == {SECRET!r}"],
    ),
    "read_service_environ": (
        f"def add(a, b): return a + b\nleak = open('/proc/{os.getpid()}/environ', 'rb').read()\n",
        ["assert b'ROLLMESH' in leak"],
    ),
    "socket": (
        "import socket\ndef add(a, b): return a + b\n"
        "s = socket.create_connection(('1.1.1.1', 53), timeout=1)\n",
        ADD_TESTS,
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_code_is_contained(
    name: str, code_verifier: tuple[Client, MeshServer, VerifierService]
) -> None:
    client, server, _ = code_verifier
    code, tests = HOSTILE[name]
    escape = Path("/tmp/rollmesh_sandbox_escape")
    escape.unlink(missing_ok=True)  # noqa: ASYNC240
    r = await client.verifier.verify("code", code_task(tests), f"```python\n{code}```")
    details = json.loads(r.details_json)
    assert r.reward == 0.0, details
    assert SECRET not in r.details_json and "root:x:0:0" not in r.details_json
    # its wall-clock limit, plus what the sandbox credited for time it waited for a CPU (a loaded host)
    assert details["duration_s"] < LIMITS.wall_s + details["cpu_wait_credit_s"] + 3
    if name in ("infinite_loop", "huge_output"):
        assert details["status"] == "timeout"
    if name == "huge_output":
        assert details["output_truncated"] and len(details["stdout"]) <= LIMITS.output_kb * 1024
    assert not escape.exists()  # noqa: ASYNC240
    assert await healthy(server.address)
    ok = await client.verifier.verify("code", code_task(ADD_TESTS), "def add(a, b):\n    return a + b\n")
    assert ok.reward == 1.0, ok.details_json


def _sandbox_processes() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    if any(line.startswith("Uid:") and line.split()[1] == "65534" for line in f):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


async def test_kernel_contains_a_fork_bomb_without_the_runner_guards() -> None:
    """With the prelude guards off, only namespaces + RLIMIT_NPROC + the pid-namespace kill remain."""
    sandbox = Sandbox(SandboxConfig(limits=LIMITS))
    mode = await sandbox.start()
    if mode != "namespaces" or os.geteuid() != 0:
        pytest.skip(
            f"needs the namespace sandbox run as root (here: mode {mode!r}, euid {os.geteuid()}); "
            "without them only the runner's guards contain a fork bomb"
        )
    before = set(_sandbox_processes())
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    res = await sandbox.run(bomb, TestSpec("asserts", ADD_TESTS), guards=False)
    assert res.status == "timeout" and res.passed == 0
    deadline = asyncio.get_running_loop().time() + 10
    # The bomb's processes are those of uid 65534 alive now that were not before; they must go
    # (SIGKILLed with the pid namespace: wait for the reaping). Sandbox runs that start later, of
    # other work on the host, are not the bomb's.
    leftover = set(_sandbox_processes()) - before
    while leftover & set(_sandbox_processes()):
        assert asyncio.get_running_loop().time() < deadline, "fork bomb processes survived the run"
        await asyncio.sleep(0.05)
    # also without guards: no network, no host files, no secrets
    probe = (
        "import os, socket\nfound = []\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n    found.append('net')\n"
        "except OSError:\n    pass\n"
        "for p in ('/etc/passwd', '/proc/1/environ', '/work', '/home', '/tmp', '/root/.bashrc'):\n"
        "    if os.path.exists(p): found.append(p)\n"
        "if os.environ.get('ROLLMESH_API_KEY'): found.append('env')\n"
    )
    relaxed = replace(LIMITS, wall_s=15.0)  # a loaded CI box: this run must not hit the wall limit
    res = await sandbox.run(
        probe, TestSpec("asserts", ["assert found == [], found"]), limits=relaxed, guards=False
    )
    assert res.status == "ok" and res.passed == 1, res
