"""The Docker Engine API, asynchronously, over the daemon's socket (`DOCKER_HOST`: `unix://PATH` or
`tcp://HOST:PORT` without TLS; else /var/run/docker.sock). What the Docker provider drives instead of
the `docker` CLI: one HTTP request costs our process well under a millisecond of CPU, where each
`docker` command was a Go program's start (20-40 ms).

Requests with a JSON (or tar) body and a JSON answer go through one aiohttp session. A command's
run (`exec start`) takes a connection of its own, hijacked as the daemon's API does it (`Upgrade:
tcp`): our stdin goes up it, then its write side is shut (the command sees end of file), and the
command's stdout and stderr come back multiplexed (8-byte frame headers) until it ends. The API
version is the daemon's, at most `API_VERSION` (negotiated once by `open`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote
from urllib.parse import urlsplit

import aiohttp

from rollmesh.verifier.bridges.container.provider import CappedOutput

#: The newest API version this client speaks (Docker 24); an older daemon's own is used.
API_VERSION = (1, 43)
DEFAULT_SOCKET = "/var/run/docker.sock"
_STDOUT, _STDERR = 1, 2


class DockerAPIError(Exception):
    """The daemon answered with an error status; `message` is its own one-line account."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Endpoint:
    """Where the daemon listens: a unix socket path, or a TCP host and port."""

    socket: str = ""
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        return f"unix://{self.socket}" if self.socket else f"tcp://{self.host}:{self.port}"


def endpoint(docker_host: str | None = None) -> Endpoint:
    """The endpoint `DOCKER_HOST` (or `docker_host`) names; ValueError for a scheme we do not speak."""
    value = os.environ.get("DOCKER_HOST", "") if docker_host is None else docker_host
    if not value:
        return Endpoint(socket=DEFAULT_SOCKET)
    parts = urlsplit(value)
    if parts.scheme == "unix" and parts.path:
        return Endpoint(socket=parts.path)
    if parts.scheme in ("tcp", "http") and parts.hostname:
        return Endpoint(host=parts.hostname, port=parts.port or 2375)
    raise ValueError(
        f"DOCKER_HOST={value!r}: the Docker provider speaks unix:// and plain tcp:// (no TLS, no ssh)"
    )


@dataclass(frozen=True)
class ExecOutcome:
    """A command's end: its exit code (None when the daemon has none: the machine went with it),
    its capped output, and whether our own deadline cut the wait."""

    exit_code: int | None
    stdout: CappedOutput
    stderr: CappedOutput
    seconds: float
    timed_out: bool = False


class DockerAPI:
    def __init__(self, where: Endpoint) -> None:
        self.where = where
        self.prefix = ""
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector: aiohttp.BaseConnector = (
                aiohttp.UnixConnector(path=self.where.socket, limit=0)
                if self.where.socket
                else aiohttp.TCPConnector(limit=0)
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._session

    def _url(self, path: str) -> str:
        host = "docker" if self.where.socket else f"{self.where.host}:{self.where.port}"
        return f"http://{host}{self.prefix}{path}"

    async def open(self) -> str:
        """Negotiate the API version; the daemon's version (raises OSError/DockerAPIError when no
        daemon answers)."""
        self.prefix = ""
        version = await self.call("GET", "/version", timeout_s=30)
        theirs = tuple(int(p) for p in str(version.get("ApiVersion", "1.24")).split(".")[:2])
        major, minor = min(theirs, API_VERSION)
        self.prefix = f"/v{major}.{minor}"
        return str(version.get("Version", "?"))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        data: bytes | None = None,
        content_type: str = "application/json",
        timeout_s: float = 120.0,
    ) -> Any:
        """One request; its JSON answer (None when it has no body). Raises DockerAPIError for an
        error status, TimeoutError past `timeout_s`, aiohttp.ClientError when the daemon is gone."""
        payload = json.dumps(body).encode() if body is not None else data
        headers = {"Content-Type": content_type} if payload is not None else {}
        async with asyncio.timeout(timeout_s):
            async with self._http().request(
                method, self._url(path), params=params, data=payload, headers=headers
            ) as response:
                raw = await response.read()
        if response.status >= 400:
            raise DockerAPIError(response.status, _message(raw))
        if not raw:
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw.decode(errors="replace")

    async def progress(
        self,
        path: str,
        *,
        params: Mapping[str, str],
        data: bytes | None = None,
        content_type: str = "application/x-tar",
        timeout_s: float,
    ) -> list[dict[str, Any]]:
        """A POST whose answer is a stream of JSON messages (a build's, a pull's), read to its end:
        the messages. A message with an `error` raises DockerAPIError(200, its error)."""
        messages: list[dict[str, Any]] = []
        headers = {"Content-Type": content_type} if data is not None else {}
        async with asyncio.timeout(timeout_s):
            async with self._http().post(
                self._url(path), params=params, data=data, headers=headers
            ) as response:
                if response.status >= 400:
                    raise DockerAPIError(response.status, _message(await response.read()))
                pending = b""
                async for chunk in response.content.iter_any():
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    messages += _messages(lines)
                messages += _messages([pending])
        for message in messages:
            if message.get("error"):
                raise DockerAPIError(200, str(message["error"]).strip())
        return messages

    async def exec(
        self,
        container: str,
        argv: Sequence[str],
        *,
        stdin: bytes,
        user: str,
        cwd: str,
        env: Mapping[str, str],
        output_limit: int,
        timeout_s: float,
    ) -> ExecOutcome:
        """Run `argv` in the container: create the exec, run it over a hijacked connection (stdin
        up, output down), read its exit code. DockerAPIError from the create (404: no such
        container, 409: it is not running) is the caller's to judge."""
        config: dict[str, Any] = {
            "AttachStdin": bool(stdin),
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Cmd": list(argv),
            "Env": [f"{k}={v}" for k, v in env.items()],
        }
        if user:
            config["User"] = user
        if cwd:
            config["WorkingDir"] = cwd
        created = await self.call("POST", f"/containers/{quote(container)}/exec", body=config, timeout_s=60)
        exec_id = str(created["Id"])
        out, err = CappedOutput(output_limit), CappedOutput(output_limit)
        began = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                await self._run_exec(exec_id, stdin, out, err)
        except TimeoutError:
            return ExecOutcome(None, out, err, time.monotonic() - began, timed_out=True)
        seconds = time.monotonic() - began
        for _ in range(100):  # the stream can end a moment before the daemon records the exit
            state = await self.call("GET", f"/exec/{exec_id}/json", timeout_s=30)
            if not state.get("Running"):
                code = state.get("ExitCode")
                return ExecOutcome(int(code) if code is not None else None, out, err, seconds)
            await asyncio.sleep(0.02)
        return ExecOutcome(None, out, err, seconds)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.where.socket:
            return await asyncio.open_unix_connection(self.where.socket, limit=1 << 20)
        return await asyncio.open_connection(self.where.host, self.where.port, limit=1 << 20)

    async def _run_exec(self, exec_id: str, stdin: bytes, out: CappedOutput, err: CappedOutput) -> None:
        reader, writer = await self._connect()
        try:
            body = b'{"Detach":false,"Tty":false}'
            host = "docker" if self.where.socket else f"{self.where.host}:{self.where.port}"
            head = (
                f"POST {self.prefix}/exec/{exec_id}/start HTTP/1.1\r\nHost: {host}\r\n"
                "Content-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            answer = await reader.readuntil(b"\r\n\r\n")
            status_line, _, header_text = answer.decode("latin-1").partition("\r\n")
            status = int(status_line.split(" ", 2)[1])
            if status not in (101, 200):
                raise DockerAPIError(status, _message(await _body(reader, header_text)))
            await asyncio.gather(_feed(writer, stdin), _demultiplex(reader, out, err))
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        if data:
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _demultiplex(reader: asyncio.StreamReader, out: CappedOutput, err: CappedOutput) -> None:
    """The command's frames until the daemon closes the stream: [kind, 0, 0, 0, size (4 bytes, big
    endian)] then `size` bytes; kind 1 is stdout, 2 stderr."""
    while True:
        try:
            header = await reader.readexactly(8)
        except asyncio.IncompleteReadError:
            return
        size = int.from_bytes(header[4:8], "big")
        try:
            payload = await reader.readexactly(size)
        except asyncio.IncompleteReadError as cut:
            payload = cut.partial
        (err if header[0] == _STDERR else out).add(payload)


async def _body(reader: asyncio.StreamReader, header_text: str) -> bytes:
    for line in header_text.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            return await reader.readexactly(int(value.strip()))
    return await reader.read(1 << 16)


def _messages(lines: list[bytes]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if line.strip():
            with contextlib.suppress(json.JSONDecodeError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    out.append(parsed)
    return out


def _message(raw: bytes) -> str:
    """The daemon's error: its JSON `message`, else the text."""
    with contextlib.suppress(json.JSONDecodeError, UnicodeDecodeError):
        parsed = json.loads(raw)
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"]).strip()
    return raw.decode(errors="replace").strip()[:500]
