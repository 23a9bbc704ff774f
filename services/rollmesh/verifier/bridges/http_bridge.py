"""The HTTP half of a bridged environment: JSON over POST/GET to an environment server, with one
cookie set per rollout session, and every way the server can fail as a named error.

- Cookies are kept by hand per session (`Cookies`), never in aiohttp's jar: the default jar drops
  cookies set by an IP host (127.0.0.1), which silently resets a server's session (a correct episode
  would then score 0). Every call sends the session's cookies; every answer's Set-Cookie updates them.
- `post`/`get` return the status and body text whatever the status (a tool's 4xx/5xx body is still
  its result); the caller decides what a status means. What never reaches an answer is raised:
  no connection (EnvServerUnreachable), no answer within `timeout_s` (EnvServerTimeout).
- `json_object` reads an answer as a JSON object or raises EnvServerBadReply (never a guess).
- `down`: why the last call reached no server ("" once one answers).
- `websocket(path)`: a `JsonSocket` on the server (one per rollout session where the server keeps an
  episode per connection: OpenEnv's /ws), JSON objects in and out, its failures named as the HTTP
  calls' are (no connection, no answer within `timeout_s`, a dropped socket, not a JSON object).
- `bridge_config` reads a bridged environment's TOML declaration (nemo_gym.toml, verifiers.toml,
  openenv.toml): unknown keys, a missing required key, `venv` (its bin/python) and paths relative to
  the folder are handled once for every kind; `built` makes the kind's config of them.
- A call whose connection fails (refused, dropped or reset before an answer: a loaded uvicorn drops
  keep-alive connections) is tried again, up to CONNECT_RETRIES times, as NeMo Gym's own client
  does; before each, `wait_ready` (a managed sidecar's `ready`: it may be restarting) is awaited,
  or a short backoff taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tomllib
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import TypeVar

import aiohttp

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.errors import NotJson
from rollmesh.verifier.errors import EnvServerBadReply
from rollmesh.verifier.errors import EnvServerTimeout
from rollmesh.verifier.errors import EnvServerUnreachable

T = TypeVar("T")

Json = dict[str, Any]
MAX_BODY_BYTES = 64 << 20
#: Calls whose connection failed (refused, dropped before an answer) are tried this many more times,
#: as NeMo Gym's own client does: a loaded uvicorn drops keep-alive connections it is handed.
CONNECT_RETRIES = 3
#: How long a call that found no server waits for a managed sidecar to serve again (`wait_ready`).
READY_TIMEOUT_S = 60.0


def bridge_config(
    path: Path,
    fields: Collection[str],
    required: str | tuple[str, ...],
    what: str,
    *,
    paths: Collection[str] = ("python",),
) -> dict[str, Any]:
    """The keys of a bridged environment's TOML file, checked: every key one of `fields` (or `venv`,
    which becomes `python` = venv/bin/python unless `python` is given), `required` a non-empty string
    (`what` says what it names; several keys: exactly one of them). The keys named in `paths`, when
    relative, are resolved against the file's folder. Any problem is a ConfigError naming the file."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    known = set(fields) | {"venv"}
    if unknown := sorted(set(raw) - known):
        raise ConfigError(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    keys = (required,) if isinstance(required, str) else required
    given = [k for k in keys if k in raw]
    if len(given) != 1 or not isinstance(raw[given[0]], str) or not raw[given[0]]:
        one = f"`{keys[0]}`" if len(keys) == 1 else "one of " + ", ".join(f"`{k}`" for k in keys)
        raise ConfigError(f"{path}: {one} ({what}) is required")
    venv = raw.pop("venv", "")
    if venv and not raw.get("python"):
        raw["python"] = str(Path(venv) / "bin" / "python")
    for key in paths:
        value = raw.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            raw[key] = str((path.parent / value).resolve())
    return raw


def built(cls: Callable[..., T], raw: dict[str, Any], path: Path) -> T:
    """`cls(**raw)`, a ConfigError naming `path` when the keys do not fit it."""
    try:
        return cls(**raw)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


@dataclass
class Cookies:
    """One rollout session's cookies, as the server last set them."""

    values: dict[str, str] = field(default_factory=dict)

    def header(self) -> dict[str, str]:
        if not self.values:
            return {}
        return {"Cookie": "; ".join(f"{k}={v}" for k, v in self.values.items())}

    def update(self, response: aiohttp.ClientResponse) -> None:
        for name, morsel in response.cookies.items():
            self.values[name] = morsel.value


@dataclass(frozen=True)
class Reply:
    status: int
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class HttpBridge:
    """JSON calls to one environment server; `open()` before use, `aclose()` after."""

    def __init__(
        self,
        name: str,
        base_url: Callable[[], str],
        *,
        timeout_s: float,
        wait_ready: Callable[[float], Awaitable[bool]] | None = None,
    ) -> None:
        self.name = name
        self._base_url = base_url
        self.timeout_s = timeout_s
        self._wait_ready = wait_ready
        self._http: aiohttp.ClientSession | None = None
        #: Why the last call found no server ("" once one answers): the environment is listed broken.
        self.down = ""

    async def open(self) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            )

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def url(self, path: str) -> str:
        return f"{self._base_url().rstrip('/')}/{path.lstrip('/')}"

    async def post(self, path: str, body: Any, cookies: Cookies | None = None) -> Reply:
        data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode()
        return await self._call("POST", path, data, cookies)

    async def get(self, path: str, cookies: Cookies | None = None) -> Reply:
        return await self._call("GET", path, None, cookies)

    async def probe(self, path: str) -> bool:
        """Whether GET `path` answers 2xx now: one try, any failure False (a sidecar's readiness)."""
        try:
            return (await self._once("GET", path, None, None)).ok
        except Exception:
            return False

    async def _call(self, method: str, path: str, data: bytes | None, cookies: Cookies | None) -> Reply:
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                return await self._once(method, path, data, cookies)
            except EnvServerUnreachable:
                if attempt == CONNECT_RETRIES:
                    raise
                if self._wait_ready is None:
                    await asyncio.sleep(0.05 * 2**attempt)
                elif not await self._wait_ready(READY_TIMEOUT_S):
                    raise
        raise AssertionError("unreachable")

    async def _once(self, method: str, path: str, data: bytes | None, cookies: Cookies | None) -> Reply:
        assert self._http is not None, "HttpBridge.open() was not called"
        url = self.url(path)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        headers |= cookies.header() if cookies is not None else {}
        with self._failures(method, url, "got no answer"):
            async with self._http.request(method, url, data=data, headers=headers) as resp:
                # read(n) gives what has arrived (up to n), not the whole body: read to the end.
                chunks: list[bytes] = []
                size = 0
                while size <= MAX_BODY_BYTES and (
                    chunk := await resp.content.read(MAX_BODY_BYTES + 1 - size)
                ):
                    chunks.append(chunk)
                    size += len(chunk)
                raw = b"".join(chunks)
                if len(raw) > MAX_BODY_BYTES:
                    raise EnvServerBadReply(
                        f"{self.name}: {method} {path} answered more than {MAX_BODY_BYTES >> 20} MiB"
                    )
                if cookies is not None:
                    cookies.update(resp)
                self.down = ""
                return Reply(resp.status, raw.decode("utf-8", "replace"))

    async def websocket(self, path: str) -> JsonSocket:
        """A WebSocket to `path` (the base URL's scheme made ws/wss): EnvServerUnreachable when it
        cannot be opened, EnvServerTimeout when the handshake gets no answer within `timeout_s`."""
        assert self._http is not None, "HttpBridge.open() was not called"
        url = self.url(path).replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        with self._failures("WebSocket", url, "was not opened"):
            async with asyncio.timeout(self.timeout_s):
                ws = await self._http.ws_connect(url, max_msg_size=MAX_BODY_BYTES, autoping=True)
        self.down = ""
        return JsonSocket(self.name, url, ws, self.timeout_s)

    @contextlib.contextmanager
    def _failures(self, what: str, url: str, timed_out: str) -> Iterator[None]:
        """aiohttp's failures of `what` (a method's call, a WebSocket's opening) at `url` as named
        errors: EnvServerTimeout when nothing came within `timeout_s` (`timed_out` says what did
        not happen), EnvServerUnreachable when there was no connection (refused, dropped, reset,
        a refused WebSocket handshake; the bridge is `down` until a call gets through), else
        EnvServerBadReply."""
        try:
            yield
        except TimeoutError:
            raise EnvServerTimeout(
                f"{self.name}: {what} {url} {timed_out} within {self.timeout_s:g}s", metadata={"url": url}
            ) from None
        except (aiohttp.ClientConnectionError, aiohttp.WSServerHandshakeError) as exc:
            self.down = f"{self.name}: {what} {url} failed: {type(exc).__name__}: {exc}"
            raise EnvServerUnreachable(self.down, metadata={"url": url}) from None
        except aiohttp.ClientError as exc:
            raise EnvServerBadReply(
                f"{self.name}: {what} {url} failed: {type(exc).__name__}: {exc}", metadata={"url": url}
            ) from None

    def json_object(self, reply: Reply, what: str) -> Json:
        """The answer as a JSON object, or EnvServerBadReply naming `what` and the first bytes."""
        return _json_object(reply.text, f"{self.name}: {what} answered {reply.status} with", "a body")


def _json_object(text: str, answered: str, what: str) -> Json:
    """`text` as a JSON object; else EnvServerBadReply: "`answered` `what` that is not JSON" with its
    first bytes, or "`answered` JSON <type>, not an object"."""
    try:
        value = untrusted_json.loads(text)
    except NotJson as exc:
        raise EnvServerBadReply(f"{answered} {what} that is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise EnvServerBadReply(f"{answered} JSON {type(value).__name__}, not an object")
    return value


class JsonSocket:
    """One WebSocket to an environment server: `call` sends a JSON object and reads the one it
    answers; every failure is named (EnvServerUnreachable: the socket closed or dropped;
    EnvServerTimeout: no answer within `timeout_s`; EnvServerBadReply: not a JSON object)."""

    def __init__(self, name: str, url: str, ws: aiohttp.ClientWebSocketResponse, timeout_s: float) -> None:
        self.name = name
        self.url = url
        self._ws = ws
        self.timeout_s = timeout_s

    @property
    def closed(self) -> bool:
        return self._ws.closed

    async def call(self, message: Json, what: str) -> Json:
        """Send `message`, return the server's answer to it (`what` names the call in errors)."""
        try:
            await self._ws.send_str(json.dumps(message, ensure_ascii=False, allow_nan=False))
            async with asyncio.timeout(self.timeout_s):
                answer = await self._ws.receive()
        except TimeoutError:
            await self._ws.close()  # a late answer would be read as the next call's
            raise EnvServerTimeout(
                f"{self.name}: {what} got no answer on {self.url} within {self.timeout_s:g}s",
                metadata={"url": self.url},
            ) from None
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            raise EnvServerUnreachable(
                f"{self.name}: {what} on {self.url} failed: {type(exc).__name__}: {exc}",
                metadata={"url": self.url},
            ) from None
        if answer.type is not aiohttp.WSMsgType.TEXT:
            how = "closed the WebSocket" if answer.type in _CLOSED else f"sent a {answer.type.name} frame"
            raise EnvServerUnreachable(
                f"{self.name}: {what}: the server {how} on {self.url} instead of answering",
                metadata={"url": self.url},
            )
        return _json_object(str(answer.data), f"{self.name}: {what} answered", "a message")

    async def send(self, message: Json) -> None:
        """Send `message` expecting no answer (best effort: a closed socket is not an error)."""
        if not self._ws.closed:
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._ws.send_str(json.dumps(message))

    async def aclose(self) -> None:
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            await self._ws.close()


_CLOSED = frozenset({aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED})
