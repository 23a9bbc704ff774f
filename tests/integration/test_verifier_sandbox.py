"""Hostile code in the `code` environment: each attempt is contained, scores 0, and the service
stays healthy (Health is checked after every one)."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from rollmesh.mesh.server import MeshServer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import SandboxConfig
from rollmesh.verifier import SandboxLimits
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.sandbox.core import PROBE_UID
from rollmesh.verifier.sandbox.core import SANDBOX_UIDS
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.sandbox.core import TestSpec
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import Client
from rollmesh_client import aio_channel

StartServer = Callable[..., Awaitable[MeshServer]]
LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=256, nproc=16, fsize_mb=1, output_kb=16)
SECRET = "sekrit-api-key-for-the-sandbox-test"
ADD_TESTS = ["assert add(2, 2) == 4"]
RUN_UIDS = {*SANDBOX_UIDS, PROBE_UID}


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
                    if any(line.startswith("Uid:") and int(line.split()[1]) in RUN_UIDS for line in f):
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
    # The bomb's processes are those of the sandbox's uids alive now that were not before; they must go
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


# A run that signals every process it may (kill -1), or takes every process its uid may have, for
# 10 s; its guards off, as code that got past them would be.
KILL_ALL = (
    "import os, signal, time\nend = time.monotonic() + 10\nwhile time.monotonic() < end:\n"
    "    try:\n        os.kill(-1, signal.SIGKILL)\n    except OSError:\n        pass\n"
    "    time.sleep(0.01)\n"
)
HOLD_NPROC = (
    "import os, time\nfor _ in range(64):\n    try:\n        if os.fork() == 0:\n"
    "            time.sleep(10)\n            os._exit(0)\n    except OSError:\n        break\n"
    "time.sleep(10)\n"
)
# Its neighbour: correct, and it forks once.
NEIGHBOUR = (
    "import os, time\ntime.sleep(1)\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
    "forked = os.waitpid(pid, 0)[1] == 0\ndef add(a, b):\n    return a + b\n"
)


@pytest.mark.parametrize("verifiers", [1, 2])
@pytest.mark.parametrize(
    ("mode", "hostile", "holding"), [("process", KILL_ALL, 1), ("namespaces", HOLD_NPROC, 12)]
)
async def test_a_run_cannot_score_its_neighbour_zero(
    mode: str, hostile: str, holding: int, verifiers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs as root had one uid: in `process` mode a run's kill -1 killed the concurrent run's runner
    (a correct answer scored 0), and a run holding its RLIMIT_NPROC kept the other from forking or
    from starting at all (its code did not load: 0). Each concurrent run now has a uid of its own,
    also when the two runs are two verifiers' (on one host, both starting at the same place in the
    block: they drew the same uid before uids were leased host-wide)."""
    if os.geteuid() != 0:
        pytest.skip("runs get a uid of their own only as root (without root they run as the service's user)")
    monkeypatch.setattr(random, "randrange", lambda n: 0)
    limits = replace(LIMITS, wall_s=30.0, cpu_s=20)
    config = SandboxConfig(isolation=mode, concurrency=2, limits=limits, allow_unsafe_process=True)
    sandbox = Sandbox(config)
    if await sandbox.start() != mode:
        pytest.skip(f"the {mode} sandbox is not available here")
    other = sandbox if verifiers == 1 else Sandbox(config)
    await other.start()
    before = set(_sandbox_processes())
    hostile_run = asyncio.create_task(sandbox.run(hostile, TestSpec("asserts", ["True"]), guards=False))
    deadline = asyncio.get_running_loop().time() + 60
    while len(set(_sandbox_processes()) - before) < holding:  # the hostile run is at it
        assert not hostile_run.done(), hostile_run.result()
        assert asyncio.get_running_loop().time() < deadline, "the hostile run never started"
        await asyncio.sleep(0.05)
    neighbour = await other.run(NEIGHBOUR, TestSpec("asserts", [*ADD_TESTS, "assert forked"]), guards=False)
    assert not hostile_run.done()  # the neighbour ran while the hostile run was at it
    await hostile_run
    await asyncio.gather(sandbox.aclose(), other.aclose())  # their pre-started clean interpreters
    assert neighbour.status == "ok" and neighbour.passed == 2, neighbour
