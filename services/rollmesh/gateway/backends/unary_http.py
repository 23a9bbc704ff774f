"""Non-streaming HTTP/1.1 POSTs to one origin over a pool of keep-alive connections, on asyncio
protocols and httptools' parser: what the OpenAI backend's unary calls need and nothing else.

aiohttp's client request path (request and response objects, header multidicts, tracing, timer
contexts, a write task per request) was the largest part of the gateway's CPU per model call on
the HTTP model path (bench/http_model_path.py); one call here is one `write` of pre-rendered header
bytes and one parse of the answer.

Contract:
- `UnaryHttpPool(base_url, headers=..., connect_timeout_s=..., read_timeout_s=...)`; `post(path,
  body, headers)` returns `HttpAnswer(status, headers (lower-case names), body)` for any status.
  The answer's body is whole: chunked transfer decoded, gzip/deflate content decoded (none is asked
  for), a body delimited by the connection's end accepted at that end.
- Connections are reused while both sides keep them alive; an idle one is closed after
  `KEEPALIVE_S`. `max_connections` (0: no cap) bounds the connections open at once: a call past it
  waits for one. A POST is not idempotent, so one case only is retried, once, on a new connection: a
  reused keep-alive connection that ended before any byte of the answer came (the server closed it
  while idle, as uvicorn does after 5 s, in the instant the call went out).
- Failures, each a `HttpCallError` subclass: `ConnectFailed` (refused, unresolvable: the cause in
  `__cause__`), `ConnectTimedOut` (no connection within `connect_timeout_s`), `ReadTimedOut` (no
  byte of the answer for `read_timeout_s` at any point), `ConnectionBroke` (the connection ended
  or failed before the answer did, or the answer is not HTTP).
- A caller cancelled while its call is under way closes that call's connection (an OpenAI server,
  vLLM, aborts the request when its connection closes); the connection never serves another call.
- An answer whose body (or its decoded content) passes `max_body_bytes` fails the call with
  `AnswerTooLarge` as soon as it does, holding no more than that: a hostile or broken server cannot
  exhaust the gateway's memory.
- Header values with CR or LF are refused (ValueError) before anything is sent. Credentials in
  the URL (`http://user:pass@host/v1`) become Basic authorization unless `headers` has one.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import unquote
from urllib.parse import urlsplit

import httptools

from rollmesh.gateway.errors import AnswerTooLarge
from rollmesh.gateway.errors import ConnectFailed
from rollmesh.gateway.errors import ConnectionBroke
from rollmesh.gateway.errors import ConnectTimedOut
from rollmesh.gateway.errors import HttpCallError
from rollmesh.gateway.errors import ReadTimedOut

MAX_BODY_BYTES = 64 * 1024 * 1024  # the mesh's gRPC message limit: no larger answer could be passed on
KEEPALIVE_S = 4.0  # below the 5 s after which uvicorn (vLLM's server) closes idle connections


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]  # names lower-case; a repeated header keeps its last value
    body: bytes


def _header_bytes(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"HTTP header {name!r} has a line break in its name or value")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one call at a time (`request`)."""

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.max_body_bytes = max_body_bytes
        self._body_bytes = 0
        self.transport: asyncio.Transport | None = None
        self.reusable = False  # the last answer left it open for another call
        self.idle_since = 0.0
        self.calls = 0  # calls sent on this connection
        self.answered_bytes = False  # a byte of the current call's answer came
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[HttpAnswer] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        self._last_bytes_at = 0.0
        self._read_timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not an asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self._last_bytes_at = time.monotonic()
        self.answered_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionBroke("the server switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(ConnectionBroke(f"the answer is not HTTP/1.1: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self.transport = None
        answer = self._answer
        if answer is None or answer.done():
            return
        if self._headers_done and not self._length_known():
            self.on_message_complete()  # a body delimited by the connection's end
            return
        cause = f": {exc!r}" if exc is not None else ""
        self._fail(ConnectionBroke(f"the server closed the connection before the answer ended{cause}"))

    # -- httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self.max_body_bytes:
            self._body.clear()
            self._fail(AnswerTooLarge(f"the answer's body is over {self.max_body_bytes} bytes"))
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is None or answer.done():
            return
        try:
            body = _decoded(
                b"".join(self._body), self._headers.get("content-encoding", ""), self.max_body_bytes
            )
        except AnswerTooLarge as exc:
            self._fail(exc)
            return
        except zlib.error as exc:
            self._fail(ConnectionBroke(f"the answer's body does not decode: {exc}"))
            return
        self.reusable = self.transport is not None and self._parser.should_keep_alive()
        answer.set_result(HttpAnswer(self._parser.get_status_code(), self._headers, body))

    # -- calls ---------------------------------------------------------------------------------

    def _length_known(self) -> bool:
        return "content-length" in self._headers or "chunked" in self._headers.get("transfer-encoding", "")

    def _fail(self, exc: HttpCallError) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    async def request(self, data: bytes, read_timeout_s: float) -> HttpAnswer:
        """Send one request (`data`: head and body) and wait for its whole answer."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[HttpAnswer] = loop.create_future()
        self._answer = answer
        self._headers, self._body, self._headers_done, self._body_bytes = {}, [], False, 0
        self._last_bytes_at = time.monotonic()
        self.reusable = False
        self.answered_bytes = False
        self.calls += 1
        self.transport.write(data)
        self._read_timer = loop.call_later(read_timeout_s, self._check_read, read_timeout_s)
        try:
            return await answer
        finally:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None
            self._answer = None

    def _check_read(self, read_timeout_s: float) -> None:
        """The read timer: fires once per `read_timeout_s`, re-armed while bytes keep coming."""
        answer = self._answer
        if answer is None or answer.done():
            return
        quiet = time.monotonic() - self._last_bytes_at
        if quiet >= read_timeout_s:
            self._fail(ReadTimedOut(f"no answer within {read_timeout_s:g} s"))
        else:
            loop = asyncio.get_running_loop()
            self._read_timer = loop.call_later(read_timeout_s - quiet, self._check_read, read_timeout_s)


def _decoded(body: bytes, encoding: str, limit: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return _inflate(body, 16 + zlib.MAX_WBITS, limit)
    if encoding == "deflate":
        try:
            return _inflate(body, zlib.MAX_WBITS, limit)
        except zlib.error:
            return _inflate(body, -zlib.MAX_WBITS, limit)  # raw deflate, as some servers send it
    raise zlib.error(f"unsupported content-encoding {encoding!r}")


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """`body` decompressed, never more than `limit` bytes of it (a small body can inflate to GiBs)."""
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit:
        raise AnswerTooLarge(f"the answer's decoded body is over {limit} bytes")
    if not inflater.eof:
        raise zlib.error("incomplete or truncated stream")
    return out


class UnaryHttpPool:
    """Keep-alive connections to the origin of `base_url` for unary POSTs (module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str],
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int = 0,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if url.scheme == "https" else None
        self._path = url.path.rstrip("/")
        host_header = url.netloc.rpartition("@")[2]
        common = {"Host": host_header, **headers}
        if url.username is not None and not any(k.lower() == "authorization" for k in headers):
            credentials = f"{unquote(url.username)}:{unquote(url.password or '')}".encode()
            common["Authorization"] = "Basic " + base64.b64encode(credentials).decode()  # as aiohttp
        self._common = _header_bytes(common)
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_body_bytes = max_body_bytes
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self._idle: list[_Connection] = []  # oldest first
        self._busy: set[_Connection] = set()
        self._closed = False

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> HttpAnswer:
        """POST `body` to `base_url` + `path`, with the pool's headers and `headers`."""
        head = (
            f"POST {self._path}{path} HTTP/1.1\r\n".encode()
            + self._common
            + _header_bytes(headers)
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        if self._slots is None:
            return await self._post(head + body)
        async with self._slots:
            return await self._post(head + body)

    async def _post(self, data: bytes) -> HttpAnswer:
        conn = await self._take()
        try:
            return await self._call(conn, data)
        except ConnectionBroke:
            if conn.calls == 1 or conn.answered_bytes:
                raise
        # a reused connection the server had closed before our call reached it: once more, anew
        return await self._call(await self._connect(), data)

    async def _call(self, conn: _Connection, data: bytes) -> HttpAnswer:
        self._busy.add(conn)
        try:
            answer = await conn.request(data, self._read_timeout_s)
        except BaseException:
            conn.close()  # cancelled or failed mid-call: this connection carries no other call
            raise
        finally:
            self._busy.discard(conn)
        if conn.reusable and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        return answer

    async def _take(self) -> _Connection:
        now = time.monotonic()
        while self._idle and now - self._idle[0].idle_since > KEEPALIVE_S:
            self._idle.pop(0).close()
        while self._idle:
            conn = self._idle.pop()
            if conn.transport is not None and not conn.transport.is_closing():
                return conn
        return await self._connect()

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self._max_body_bytes),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise ConnectTimedOut(f"no connection within {self._connect_timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {self._host}:{self._port}: {exc}") from exc
        return conn

    async def close(self) -> None:
        """Close every connection (calls under way fail with ConnectionBroke)."""
        self._closed = True
        for conn in [*self._idle, *self._busy]:
            conn.close()
        self._idle.clear()
