"""The gateway's lean unary HTTP client (gateway/backends/unary_http.py) against real local servers:
keep-alive reuse, chunked / gzip / connection-delimited bodies, every failure class (refused, read
timeout, a connection closed mid-answer, not HTTP), a cancelled call closes its connection (the
server sees it), header injection refused, a connection cap, and 512 concurrent calls on uvloop."""

from __future__ import annotations

import asyncio
import base64
import gzip
import importlib.util
import json
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from rollmesh.gateway.backends.unary_http import UnaryHttpPool
from rollmesh.gateway.errors import AnswerTooLarge
from rollmesh.gateway.errors import ConnectFailed
from rollmesh.gateway.errors import ConnectionBroke
from rollmesh.gateway.errors import ReadTimedOut

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


class Upstream:
    """An aiohttp app under /v1 that records what it saw."""

    def __init__(self) -> None:
        self.peers: set[tuple[str, int]] = set()
        self.requests: list[tuple[Mapping[str, str], bytes]] = []
        self.hanging = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.base_url = ""

    async def echo(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer is not None:
            self.peers.add((peer[0], peer[1]))
        body = await request.read()
        self.requests.append((request.headers.copy(), body))
        return web.json_response({"path": request.path, "body": json.loads(body)})

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b'{"parts": ', b"[1, 2", b", 3]}"):
            await resp.write(part)
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    async def gzipped(self, request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(b'{"zipped": true}'), headers={"Content-Encoding": "gzip"})

    async def status(self, request: web.Request) -> web.Response:
        return web.Response(
            status=429, text='{"error": {"message": "slow down"}}', headers={"Retry-After": "3"}
        )

    async def hang(self, request: web.Request) -> web.Response:
        self.hanging.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.disconnected.set()  # aiohttp cancels the handler when the client's connection closes
            raise
        return web.Response(text="late")

    async def slow_bytes(self, request: web.Request) -> web.StreamResponse:
        """An answer whose bytes keep coming, each well within the read timeout, 1 s in all."""
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(10):
            await resp.write(b" ")
            await asyncio.sleep(0.1)
        await resp.write(b"{}")
        await resp.write_eof()
        return resp


@pytest_asyncio.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    app = web.Application(handler_args={"handler_cancellation": True})
    app.router.add_post("/v1/echo", up.echo)
    app.router.add_post("/v1/chunked", up.chunked)
    app.router.add_post("/v1/gzipped", up.gzipped)
    app.router.add_post("/v1/status", up.status)
    app.router.add_post("/v1/hang", up.hang)
    app.router.add_post("/v1/slow", up.slow_bytes)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    up.base_url = f"http://127.0.0.1:{port}/v1"
    try:
        yield up
    finally:
        await runner.cleanup()


def _pool(base_url: str, **kw: float) -> UnaryHttpPool:
    return UnaryHttpPool(
        base_url,
        headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
        connect_timeout_s=kw.pop("connect_timeout_s", 5.0),
        read_timeout_s=kw.pop("read_timeout_s", 30.0),
        max_connections=int(kw.pop("max_connections", 0)),
    )


async def test_answers_and_headers_and_keep_alive(upstream: Upstream) -> None:
    pool = _pool(upstream.base_url)
    try:
        for i in range(5):
            answer = await pool.post("/echo", json.dumps({"i": i}).encode(), {"X-Request-Id": f"r{i}"})
            assert answer.status == 200
            assert json.loads(answer.body) == {"path": "/v1/echo", "body": {"i": i}}
            assert answer.headers["content-type"].startswith("application/json")
        headers, _ = upstream.requests[-1]
        assert headers["Authorization"] == "Bearer k" and headers["X-Request-Id"] == "r4"
        assert headers["Host"] == upstream.base_url.split("/")[2]
        assert len(upstream.peers) == 1  # one connection served all five calls
    finally:
        await pool.close()


async def test_chunked_gzip_and_error_statuses_come_back_whole(upstream: Upstream) -> None:
    pool = _pool(upstream.base_url)
    try:
        assert json.loads((await pool.post("/chunked", b"{}", {})).body) == {"parts": [1, 2, 3]}
        assert json.loads((await pool.post("/gzipped", b"{}", {})).body) == {"zipped": True}
        limited = await pool.post("/status", b"{}", {})
        assert (limited.status, limited.headers["retry-after"]) == (429, "3")
        assert json.loads(limited.body)["error"]["message"] == "slow down"
        assert (await pool.post("/nowhere", b"{}", {})).status == 404
    finally:
        await pool.close()


async def test_refused_connection() -> None:
    pool = _pool("http://127.0.0.1:9/v1")
    with pytest.raises(ConnectFailed, match="cannot connect"):
        await pool.post("/echo", b"{}", {})
    await pool.close()


async def test_read_timeout_counts_silence_not_the_whole_answer(upstream: Upstream) -> None:
    pool = _pool(upstream.base_url, read_timeout_s=0.5)
    try:
        assert (await pool.post("/slow", b"{}", {})).body.strip() == b"{}"  # 1 s in all, never 0.5 s quiet
        with pytest.raises(ReadTimedOut):
            await pool.post("/hang", b"{}", {})
        assert (await pool.post("/echo", b"{}", {})).status == 200  # the pool still works
    finally:
        await pool.close()


async def test_a_cancelled_call_closes_its_connection(upstream: Upstream) -> None:
    pool = _pool(upstream.base_url)
    try:
        call = asyncio.ensure_future(pool.post("/hang", b"{}", {}))
        async with asyncio.timeout(30):
            await upstream.hanging.wait()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await upstream.disconnected.wait()  # the server saw the connection close
        assert (await pool.post("/echo", b"{}", {})).status == 200
    finally:
        await pool.close()


async def _raw_server(handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> Any:
    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def test_connection_delimited_body_broken_answers_and_garbage() -> None:
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        path = head.split(b" ")[1]
        await reader.readexactly(length)
        if path.endswith(b"/eof-body"):  # no length, no chunks: the body ends with the connection
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b'{"eof": 1}')
        elif path.endswith(b"/cut"):  # promises 100 bytes, sends 5, closes
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"a":')
        elif path.endswith(b"/garbage"):
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await _raw_server(reply)
    port = server.sockets[0].getsockname()[1]
    pool = _pool(f"http://127.0.0.1:{port}/v1")
    try:
        answer = await pool.post("/eof-body", b"{}", {})
        assert (answer.status, json.loads(answer.body)) == (200, {"eof": 1})
        with pytest.raises(ConnectionBroke, match="before the answer ended"):
            await pool.post("/cut", b"{}", {})
        with pytest.raises(ConnectionBroke, match="not HTTP"):
            await pool.post("/garbage", b"{}", {})
    finally:
        await pool.close()
        server.close()
        await server.wait_closed()


async def test_header_injection_is_refused_before_sending(upstream: Upstream) -> None:
    pool = _pool(upstream.base_url)
    with pytest.raises(ValueError, match="line break"):
        await pool.post("/echo", b"{}", {"X-Session-Id": "s\r\nX-Admin: 1"})
    assert upstream.requests == []
    await pool.close()


async def test_credentials_in_the_url_are_basic_auth(upstream: Upstream) -> None:
    pool = UnaryHttpPool(
        upstream.base_url.replace("http://", "http://us%40er:p%3Ass@"),
        headers={"Content-Type": "application/json"},
        connect_timeout_s=5.0,
        read_timeout_s=30.0,
    )
    try:
        assert (await pool.post("/echo", b"{}", {})).status == 200
        headers, _ = upstream.requests[-1]
        assert headers["Authorization"] == "Basic " + base64.b64encode(b"us@er:p:ss").decode()
        assert "@" not in headers["Host"]
    finally:
        await pool.close()


async def test_max_connections_caps_the_connections_open(upstream: Upstream) -> None:
    pool = _pool(upstream.base_url, max_connections=2)
    try:
        answers = await asyncio.gather(*(pool.post("/echo", b"{}", {}) for _ in range(20)))
        assert all(a.status == 200 for a in answers)
        assert len(upstream.peers) <= 2
    finally:
        await pool.close()


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed in this environment")
def test_512_concurrent_calls_on_uvloop() -> None:
    """The gateway runs on uvloop, whose transports differ from asyncio's."""
    import uvloop

    async def main() -> tuple[int, int]:
        up = Upstream()
        app = web.Application()
        app.router.add_post("/v1/echo", up.echo)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        pool = _pool(f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
        try:

            async def worker(w: int) -> int:
                ok = 0
                for i in range(4):
                    answer = await pool.post("/echo", json.dumps({"w": w, "i": i}).encode(), {})
                    ok += json.loads(answer.body)["body"] == {"w": w, "i": i}
                return ok

            async with asyncio.timeout(120):
                oks = await asyncio.gather(*(worker(w) for w in range(512)))
            return sum(oks), len(up.peers)
        finally:
            await pool.close()
            await runner.cleanup()

    ok, connections = uvloop.run(main())
    assert ok == 512 * 4
    assert connections <= 512  # reused: never more connections than calls at once


async def test_a_reused_connection_closed_before_the_call_is_retried_once_on_a_new_one() -> None:
    """A keep-alive connection the server closes while idle races the next call sent on it: the
    server never read that call, so it goes once more on a new connection. A new connection that
    ends without an answer is not retried (the server may have run the call)."""
    seen: list[int] = []  # per request: the index of the connection it came on
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        index, connections = connections, connections + 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                seen.append(index)
                if served == 1 or head.split(b" ")[1].endswith(b"/drop"):
                    break  # the idle close, as the call arrives: no byte of an answer
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
                served += 1
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    server = await _raw_server(serve)
    port = server.sockets[0].getsockname()[1]
    pool = _pool(f"http://127.0.0.1:{port}/v1")
    try:
        assert (await pool.post("/echo", b"{}", {})).status == 200
        assert (await pool.post("/echo", b"{}", {})).status == 200  # reused, dropped, sent anew
        assert seen == [0, 0, 1] and connections == 2
        pool_new = _pool(f"http://127.0.0.1:{port}/v1")
        try:
            with pytest.raises(ConnectionBroke):
                await pool_new.post("/drop", b"{}", {})
            assert seen[3:] == [2]  # sent once: a new connection's failure is the caller's to judge
        finally:
            await pool_new.close()
    finally:
        await pool.close()
        server.close()


def _self_signed(tmp_dir: Any) -> tuple[str, str]:
    """A certificate for localhost and 127.0.0.1 and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = f"{tmp_dir}/cert.pem", f"{tmp_dir}/key.pem"
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


async def test_https_verifies_the_server_certificate(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """https:// goes over TLS with the system's trust store (SSL_CERT_FILE adds a private CA): a
    certificate nobody vouches for is refused in one line, a trusted one serves calls."""
    import ssl

    cert_path, key_path = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert_path, key_path)
    up = Upstream()
    app = web.Application()
    app.router.add_post("/v1/echo", up.echo)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls).start()
    port = runner.addresses[0][1]
    try:
        untrusted = _pool(f"https://localhost:{port}/v1")
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED"):
            await untrusted.post("/echo", b"{}", {})
        await untrusted.close()

        monkeypatch.setenv("SSL_CERT_FILE", cert_path)
        trusted = _pool(f"https://localhost:{port}/v1")
        try:
            for i in range(3):
                answer = await trusted.post("/echo", json.dumps({"i": i}).encode(), {})
                assert json.loads(answer.body) == {"path": "/v1/echo", "body": {"i": i}}
            assert len(up.peers) == 1  # the TLS connection is kept alive too
            assert up.requests[-1][0]["Host"] == f"localhost:{port}"
        finally:
            await trusted.close()
    finally:
        await runner.cleanup()


async def test_an_answer_over_the_body_limit_fails_without_being_held() -> None:
    """A body past max_body_bytes (sent whole, or a small gzip that inflates past it) fails the
    call with AnswerTooLarge; the pool keeps working."""
    big = b'{"x": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    bomb = gzip.compress(b" " * (8 * 1024 * 1024))  # ~8 KiB on the wire

    async def serve(request: web.Request) -> web.Response:
        if request.path.endswith("/big"):
            return web.Response(body=big, content_type="application/json")
        if request.path.endswith("/bomb"):
            return web.Response(body=bomb, headers={"Content-Encoding": "gzip"})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/{name}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    pool = UnaryHttpPool(
        f"http://127.0.0.1:{runner.addresses[0][1]}/v1",
        headers={},
        connect_timeout_s=5.0,
        read_timeout_s=30.0,
        max_body_bytes=1024 * 1024,
    )
    try:
        with pytest.raises(AnswerTooLarge, match="over 1048576 bytes"):
            await pool.post("/big", b"{}", {})
        with pytest.raises(AnswerTooLarge, match="decoded body is over"):
            await pool.post("/bomb", b"{}", {})
        assert json.loads((await pool.post("/small", b"{}", {})).body) == {"ok": True}
    finally:
        await pool.close()
        await runner.cleanup()


async def test_a_server_sent_event_line_over_the_limit_is_a_bad_response() -> None:
    """The streaming path's line reader: lines split across blocks are joined, a line past the
    limit is UPSTREAM_BAD_RESPONSE (not held whole in memory)."""
    from rollmesh.gateway.backends.openai import _sse_data
    from rollmesh.gateway.errors import UpstreamBadResponse

    class Content:
        def __init__(self, blocks: list[bytes]) -> None:
            self.blocks = blocks

        async def iter_any(self) -> AsyncIterator[bytes]:
            for block in self.blocks:
                yield block

    class Resp:
        url = "http://upstream/v1/chat/completions"

        def __init__(self, blocks: list[bytes]) -> None:
            self.content = Content(blocks)

    fine = Resp([b'data: {"a"', b": 1}\n\nda", b"ta: [DONE]"])
    assert [d async for d in _sse_data(fine, max_line_bytes=64)] == ['{"a": 1}', "[DONE]"]  # type: ignore[arg-type]
    endless = Resp([b"data: " + b"x" * 40] * 10)
    with pytest.raises(UpstreamBadResponse, match="line over 64 bytes"):
        [d async for d in _sse_data(endless, max_line_bytes=64)]  # type: ignore[arg-type]
