"""The Docker provider's client of the Engine API (verifier/bridges/container/docker_api.py) against
a fake daemon on a unix socket here: DOCKER_HOST's forms, JSON calls and their errors, an exec's
stdin going up its hijacked connection and its stdout and stderr coming back demultiplexed; and the
settings the Docker provider refuses when the environment is configured. The real daemon's tests
are tests/e2e/test_container_tasks_docker.py (`make test-containers`)."""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollmesh.mesh.errors import ConfigError
from rollmesh.verifier.bridges.container.docker_api import DockerAPI
from rollmesh.verifier.bridges.container.docker_api import DockerAPIError
from rollmesh.verifier.bridges.container.docker_api import Endpoint
from rollmesh.verifier.bridges.container.docker_api import endpoint
from rollmesh.verifier.bridges.container.env import Settings
from rollmesh.verifier.bridges.container.env import make_provider


def test_docker_host_names_a_unix_socket_or_plain_tcp() -> None:
    assert endpoint("") == Endpoint(socket="/var/run/docker.sock")
    assert endpoint("unix:///run/d/docker.sock") == Endpoint(socket="/run/d/docker.sock")
    assert endpoint("tcp://10.0.0.2:2376") == Endpoint(host="10.0.0.2", port=2376)
    with pytest.raises(ValueError, match=r"ssh://.*unix:// and plain tcp://"):
        endpoint("ssh://me@host")


def _frame(kind: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", kind, len(data)) + data


class FakeDaemon:
    """Answers what DockerAPI asks: /version, an exec's create/start/inspect (the command echoes
    its stdin to stdout upper-cased, says `err` on stderr and exits 3), 404 for anything else."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.exec_config: dict[str, object] = {}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, path, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        body = await reader.readexactly(length) if length else b""
        self.requests.append((method, path))
        if path.endswith("/start"):
            writer.write(
                b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.multiplexed-stream\r\n\r\n"
            )
            stdin = await reader.read()  # until our write side is shut: the command's end of file
            writer.write(_frame(1, stdin.upper()) + _frame(2, b"err\n") + _frame(1, b"!"))
            await writer.drain()
            writer.close()
            return
        if path.endswith("/version"):
            answer, status = {"ApiVersion": "1.41", "Version": "20.10.24"}, 200
        elif path.endswith("/containers/c1/exec"):
            self.exec_config = json.loads(body)
            answer, status = {"Id": "e1"}, 201
        elif path.endswith("/exec/e1/json"):
            answer, status = {"Running": False, "ExitCode": 3}, 200
        else:
            answer, status = {"message": "No such container: c2"}, 404
        data = json.dumps(answer).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nConnection: close\r\n".encode()
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def daemon() -> AsyncIterator[tuple[FakeDaemon, DockerAPI]]:
    fake = FakeDaemon()
    # A short folder: a unix socket's path is at most 107 bytes, and pytest's tmp_path can be longer.
    folder = Path(tempfile.mkdtemp(prefix="rm-dapi-", dir="/tmp"))
    server = await asyncio.start_unix_server(fake.handle, path=str(folder / "docker.sock"))
    api = DockerAPI(endpoint(f"unix://{folder / 'docker.sock'}"))
    try:
        yield fake, api
    finally:
        await api.aclose()
        server.close()
        await server.wait_closed()
        shutil.rmtree(folder, ignore_errors=True)


async def test_the_api_version_is_the_older_of_the_daemons_and_ours(
    daemon: tuple[FakeDaemon, DockerAPI],
) -> None:
    fake, api = daemon
    assert await api.open() == "20.10.24"
    assert api.prefix == "/v1.41"
    with pytest.raises(DockerAPIError) as caught:
        await api.call("GET", "/containers/c2/json")
    assert (caught.value.status, caught.value.message) == (404, "No such container: c2")
    assert fake.requests == [("GET", "/version"), ("GET", "/v1.41/containers/c2/json")]


async def test_an_exec_sends_its_stdin_and_reads_its_two_streams_and_exit_code(
    daemon: tuple[FakeDaemon, DockerAPI],
) -> None:
    fake, api = daemon
    await api.open()
    ended = await api.exec(
        "c1",
        ["cat"],
        stdin=b"hello",
        user="1000",
        cwd="/app",
        env={"A": "1"},
        output_limit=1024,
        timeout_s=30,
    )
    assert (ended.exit_code, ended.stdout.value(), ended.stderr.value(), ended.timed_out) == (
        3,
        b"HELLO!",
        b"err\n",
        False,
    )
    assert fake.exec_config == {
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "Cmd": ["cat"],
        "Env": ["A=1"],
        "User": "1000",
        "WorkingDir": "/app",
    }
    with pytest.raises(DockerAPIError) as caught:  # a container that is gone: the caller's MachineLost
        await api.exec("c2", ["true"], stdin=b"", user="", cwd="", env={}, output_limit=10, timeout_s=30)
    assert caught.value.status == 404


def test_warm_machines_on_docker_are_refused_when_the_environment_is_configured(tmp_path: Path) -> None:
    settings = Settings(tasks=tmp_path, provider="docker", warm=2)
    with pytest.raises(
        ConfigError, match=r"warm = 2 .*docker provider starts no machines ahead.*labels are fixed"
    ):
        make_provider(settings, tmp_path)
    assert make_provider(Settings(tasks=tmp_path, provider="daemonless", warm=2), tmp_path).relabels
