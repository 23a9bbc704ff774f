"""Isolation of the `code` sandbox, against a real `rollmesh serve verifier` subprocess whose own
environment holds ROLLMESH_API_KEY, in every mode allowed to run here:

- the secret never reaches the untrusted code (its environment, /proc of any process it can see,
  any file descriptor it inherited), with the runner's Python guards bypassed through `posix`;
- nothing it starts outlives the verify (a double-forked, setsid daemon is gone afterwards);
- where the mode claims network isolation (namespaces), it cannot connect to a local port;
- where the mode claims to bound what it writes in all (namespaces), it cannot write more;
- the mode is logged at start and shown in ListEnvironments and `rollmesh status`;
- without OS-level isolation the environment refuses to start, naming what is missing, unless
  the operator opts in (ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS=1)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmesh.launch.status import mesh_status
from rollmesh.verifier import SandboxConfig
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh_client import Client
from tests.procs import ROLLMESH
from tests.procs import ServerProc
from tests.procs import spawn_server

SECRET = f"sekrit-{uuid.uuid4().hex}"
LABELS = {"namespaces": "namespaces", "process": "unsafe-process"}


def _verifier_env(mode: str, **extra: str) -> dict[str, str]:
    env = {
        "ROLLMESH_API_KEY": SECRET,
        "ROLLMESH_VERIFIER_SANDBOX_ISOLATION": mode,
        "ROLLMESH_VERIFIER_SANDBOX_WALL_S": "20",
        "ROLLMESH_VERIFIER_SANDBOX_CONCURRENCY": "2",
        "ROLLMESH_VERIFIER_WORKERS": "1",
        **extra,
    }
    if mode == "process":
        env["ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS"] = "1"
    return env


@pytest.fixture(scope="module", params=["namespaces", "process"])
def verifier(request: pytest.FixtureRequest) -> Iterator[tuple[ServerProc, str]]:
    mode = str(request.param)
    if mode == "namespaces":
        ok, why = asyncio.run(Sandbox(SandboxConfig()).probe())
        if not ok:
            pytest.skip(f"namespaces are not available here: {why}")
    elif os.geteuid() != 0:
        pytest.skip(
            "the process mode keeps these guarantees only as root (the code runs as a uid of its own under a "
            "keeper); as non-root it is the UNSAFE opt-in and promises none of them"
        )
    with spawn_server(
        [str(ROLLMESH), "serve", "verifier", "--port", "0"], env=_verifier_env(mode), timeout_s=180
    ) as server:
        yield server, mode


@pytest.fixture
async def client(verifier: tuple[ServerProc, str]) -> AsyncIterator[Client]:
    c = await Client.connect(verifier=verifier[0].address, api_key=SECRET, timeout_s=90)
    try:
        yield c
    finally:
        await c.close()


def _only_verifier(address: str) -> dict[str, str]:
    down = "127.0.0.1:9"  # discard: nothing listens, those rows read UNREACHABLE
    return {"registry": down, "verifier": address, "gateway": down, "scheduler": down}


async def _verify(client: Client, code: str, tests: list[str]) -> tuple[float, dict[str, object]]:
    r = await client.verifier.verify("code", {"verifier_metadata": {"tests": tests}}, f"```python\n{code}```")
    return r.reward, json.loads(r.details_json)


LOOK_FOR_SECRETS = """
import os, posix
blob, sources = [repr(dict(os.environ)).encode()], ['os.environ']
for pid in (posix.listdir('/proc') if os.path.isdir('/proc') else []):
    for name in ('environ', 'cmdline'):
        try:
            fd = posix.open(f'/proc/{pid}/{name}', posix.O_RDONLY)
            blob.append(posix.read(fd, 1 << 16)); posix.close(fd); sources.append(f'{pid}/{name}')
        except OSError:
            pass
for fd in range(256):
    try:
        blocking = posix.get_blocking(fd)
        posix.set_blocking(fd, False)
    except OSError:
        continue
    try:
        blob.append(posix.read(fd, 1 << 16)); sources.append(f'fd {fd}')
    except OSError:
        pass
    finally:
        posix.set_blocking(fd, blocking)
def leaked():
    return b''.join(blob).decode('utf-8', 'replace')
def looked():
    return sources
"""


async def test_secrets_never_reach_the_code(client: Client, verifier: tuple[ServerProc, str]) -> None:
    reward, details = await _verify(
        client, LOOK_FOR_SECRETS, [f"assert {SECRET!r} not in leaked()", "assert 'os.environ' in looked()"]
    )
    assert reward == 1.0, details
    assert SECRET not in json.dumps(details)


DAEMON = """
import posix, time
def add(a, b):
    r, w = posix.pipe()
    if posix.fork() == 0:
        posix.setsid()
        if posix.fork() == 0:
            posix.write(w, b'1')
            posix.execv('/bin/sleep', ['MARKER', '600'])
        posix._exit(0)
    posix.read(r, 1)
    time.sleep(3)
    return a + b
"""


def _processes_named(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(marker.encode()):
                found.append(int(entry))
    return found


async def test_nothing_it_starts_outlives_the_verify(client: Client) -> None:
    marker = f"rollmesh-daemon-{uuid.uuid4().hex}"
    verify = asyncio.create_task(_verify(client, DAEMON.replace("MARKER", marker), ["assert add(2, 2) == 4"]))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not _processes_named(marker):  # the daemon really ran, outside its parent's session
        assert not verify.done(), verify.result()
        assert loop.time() < deadline, "the daemon never started"
        await asyncio.sleep(0.05)
    reward, details = await verify
    assert reward == 1.0, details
    deadline = loop.time() + 10
    while survivors := _processes_named(marker):
        assert loop.time() < deadline, f"daemon {survivors} outlived the verify"
        await asyncio.sleep(0.05)


CONNECT = """
import _socket
def attempt(port):
    s = _socket.SocketType(_socket.AF_INET, _socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(('127.0.0.1', port))
        return 'connected'
    except OSError as exc:
        return type(exc).__name__
"""


async def test_local_ports_are_reachable_exactly_as_the_mode_claims(
    client: Client, verifier: tuple[ServerProc, str]
) -> None:
    """namespaces: no connection to any local port. unsafe-process claims no network isolation
    (docs/security.md, "Sandbox"), and the test holds it to that claim, not to more."""
    isolated = verifier[1] == "namespaces"
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reward, details = await _verify(client, CONNECT, [f"assert attempt({port}) != 'connected'"])
    finally:
        server.close()
        await server.wait_closed()
    if isolated:
        assert reward == 1.0, details
        assert accepted == []
    else:
        assert reward == 0.0, details
        assert accepted == [1]


WRITE_FILES = """
import posix
def written():
    n = 0
    for i in range(64):
        try:
            fd = posix.open(f'f{i}', posix.O_WRONLY | posix.O_CREAT, 0o600)
            posix.write(fd, b'x' * (1 << 20))
            posix.close(fd)
        except OSError:
            break
        n += 1
    return n
"""


async def test_what_it_writes_is_bounded_as_the_mode_claims(
    client: Client, verifier: tuple[ServerProc, str]
) -> None:
    """namespaces: all the run writes, together, fits in ROLLMESH_VERIFIER_SANDBOX_FSIZE_MB (8 MiB
    here: its /sandbox is a tmpfs that size; files on the host's disk were bounded one by one
    only, ~1 GB written per CPU second). unsafe-process bounds each file only (README), and the
    test holds it to that claim."""
    bound = "written() <= 9" if verifier[1] == "namespaces" else "written() == 64"
    reward, details = await _verify(client, WRITE_FILES, [f"assert {bound}"])
    assert reward == 1.0, details


async def test_mode_is_logged_listed_and_in_status(client: Client, verifier: tuple[ServerProc, str]) -> None:
    server, mode = verifier
    label = LABELS[mode]
    envs = {e.name: e for e in [e async for e in client.verifier.environments()]}
    assert envs["code"].sandbox == label
    assert envs["arithmetic"].sandbox == ""
    event = "sandbox_isolation" if mode == "namespaces" else "sandbox_isolation_unsafe"
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    assert any(e.get("event") == event and e.get("mode") == mode for e in events), server.log()[-2000:]
    statuses = await mesh_status(_only_verifier(server.address), api_key=SECRET, timeout_s=10)
    verifier_status = next(s for s in statuses if s.service == "verifier")
    assert f"code sandbox: {label}" in verifier_status.detail, verifier_status.detail


async def test_refuses_to_start_without_isolation_unless_opted_in(tmp_path: Path) -> None:
    """No unshare(1) on PATH: `auto` makes the code environment broken, with an error naming what
    is missing and the opt-in; with the opt-in it runs as unsafe-process and says so."""
    no_tools = {"PATH": str(tmp_path)}
    env = {**_verifier_env("auto"), **no_tools}
    with spawn_server([str(ROLLMESH), "serve", "verifier", "--port", "0"], env=env, timeout_s=180) as server:
        async with await Client.connect(verifier=server.address, api_key=SECRET, timeout_s=60) as c:
            listing = await c.verifier.list()
            broken = {b.name: b.error for b in listing.broken}
            assert "code" in broken and "code" not in {e.name for e in listing.environments}
            assert "unshare" in broken["code"]
            assert "ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS" in broken["code"]
            statuses = await mesh_status(_only_verifier(server.address), api_key=SECRET, timeout_s=10)
            assert "broken code" in next(s for s in statuses if s.service == "verifier").detail
    opted_in = {**env, "ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS": "1"}
    with spawn_server(
        [str(ROLLMESH), "serve", "verifier", "--port", "0"], env=opted_in, timeout_s=180
    ) as server:
        async with await Client.connect(verifier=server.address, api_key=SECRET, timeout_s=60) as c:
            envs = {e.name: e for e in [e async for e in c.verifier.environments()]}
            assert envs["code"].sandbox == "unsafe-process"
            task = {"verifier_metadata": {"tests": ["assert f() == 1"]}}
            r = await c.verifier.verify("code", task, "def f(): return 1")
            assert r.reward == 1.0, r.details_json
        assert "sandbox_isolation_unsafe" in server.log()
