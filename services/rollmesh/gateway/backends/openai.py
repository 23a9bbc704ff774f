"""A backend over any OpenAI-compatible `/v1/chat/completions` endpoint (e.g. a pre-hosted vLLM).

`supports_token_ids = False`: the remote server renders the chat template and tokenizes, so the
gateway sends messages and cannot build prompts from kept ids. Token-exact multi-turn (and
`prompt_token_ids` input) needs a token-id backend (ray-serve, fake). When the server is vLLM, the
request asks for its `return_token_ids` extension, so responses still carry the prompt and output
ids the server used; other servers ignore the field and the ids stay empty.

Calls: a request that wants deltas (`EngineRequest.stream`) is streamed as SSE (aiohttp); a unary
one is one non-streaming POST answered by one chunk, sent by the lean keep-alive client of
unary_http.py (aiohttp's request path was the largest part of the gateway's CPU per call). Both
report the upstream's `usage` on the last chunk. The connection pools have no cap of their own by
default (`max_connections=0`): every request in flight gets a connection, so the caller's
concurrency (the scheduler's bound) is the one that holds.

Tool calls the server returns as structured `tool_calls` are re-rendered as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>` text, so the gateway parses every backend's
output the same way.

Failures name their cause (gateway/errors.py): HTTP 5xx -> UPSTREAM_HTTP_ERROR, 429 ->
UPSTREAM_RATE_LIMITED (RetryInfo from Retry-After), 401/403 -> UPSTREAM_AUTH_FAILED, 404 ->
MODEL_NOT_FOUND, 408 or no bytes for `timeout_s` -> UPSTREAM_TIMEOUT, other 4xx -> UPSTREAM_REJECTED
(each with `metadata["http_status"]`); no connection (refused, or none within 10 s) ->
UPSTREAM_UNREACHABLE; a connection closed mid-answer, or a stream that ends without
`data: [DONE]` -> UPSTREAM_STREAM_DROPPED; a 200 that is not a chat completion (not JSON, no
`choices`, a choice without a `message`, a stream that ends with no choice, a field of the wrong
type: `usage`, `content`, `tool_calls`, `logprobs`, an SSE line that is not JSON) ->
UPSTREAM_BAD_RESPONSE, never an empty answer nor an internal error; an answer the server cut with
finish_reason `content_filter` -> UPSTREAM_CONTENT_FILTERED (a half answer is never scored). An
answer with no finish_reason (null, missing, or a stream whose chunks name none before [DONE]) ends
with finish_reason "unknown", never "stop": it may be cut, and the agent runs no tool call from it.
Content given as a list of text parts is read as their text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from rollmesh.gateway import errors
from rollmesh.gateway.backends import unary_http
from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.base import ModelBackend
from rollmesh.gateway.backends.base import ModelCard
from rollmesh.gateway.backends.base import ReplicaStatus
from rollmesh.mesh import untrusted_json
from rollmesh.mesh.chat import content_text
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.gateway.openai")


def _render_calls(calls: dict[int, dict[str, str]]) -> str:
    parts = []
    for _, c in sorted(calls.items()):
        args = c.get("arguments") or "{}"
        parts.append(
            f'<tool_call>{{"name": {json.dumps(c.get("name", ""))}, "arguments": {args}}}</tool_call>'
        )
    return "".join(parts)


def _finish_reason(reason: object, where: str) -> str:
    if reason == "content_filter":  # the server withheld the rest: a half answer, never scored
        raise errors.UpstreamContentFiltered(
            f"{where}: the server cut the answer (finish_reason content_filter)"
        )
    if not reason:  # null or missing: a cut answer would look the same, so never "stop"
        return "unknown"
    return reason if reason in ("length", "abort") else "stop"


_MALFORMED = (TypeError, ValueError, AttributeError, KeyError)  # a field of the wrong type or shape


def _logprobs(choice: dict[str, Any]) -> tuple[float, ...]:
    lp = choice.get("logprobs") or {}
    return tuple(float(x["logprob"]) for x in lp.get("content") or ())


def _usage(obj: dict[str, Any]) -> tuple[int, int]:
    usage = obj.get("usage") or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


class OpenAIBackend(ModelBackend):
    supports_token_ids = False

    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        model: str = "",
        api_key: str = "",
        max_model_len: int = 0,
        timeout_s: float = 600.0,
        max_connections: int = 0,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.remote_model = model or name
        self._api_key = api_key
        self._max_model_len = max_model_len
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_s)
        self._max_connections = max(0, max_connections)
        self._chat_url = URL(f"{self.base_url}/chat/completions")
        self._session: aiohttp.ClientSession | None = None
        self._unary_pool: unary_http.UnaryHttpPool | None = None
        self._healthy = False
        # request id -> the task waiting on a unary call, or the open streaming response
        self._running: dict[str, asyncio.Task[Any] | aiohttp.ClientResponse | None] = {}
        self._aborted: set[str] = set()
        self.replica_id = urlsplit(self.base_url).netloc or self.base_url

    @property
    def card(self) -> ModelCard:
        return ModelCard(name=self.name, backend="openai", max_model_len=self._max_model_len)

    def _auth_headers(self) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        return {"Content-Type": "application/json", **auth}

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, keepalive_timeout=unary_http.KEEPALIVE_S
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._auth_headers(),
                timeout=self._timeout,
                raise_for_status=False,
                cookie_jar=aiohttp.DummyCookieJar(),  # an API: no cookies to keep per call
            )
        return self._session

    def _refused(self, status: int) -> str:
        """What a 401/403 means here: a wrong key, or none sent at all (the key is read from the
        variable ROLLMESH_GATEWAY_API_KEY_ENV names, OPENAI_API_KEY by default)."""
        if self._api_key:
            return f"refused the API key (HTTP {status})"
        return (
            f"wants an API key and none was sent (HTTP {status}): put it in OPENAI_API_KEY, or in the"
            " variable ROLLMESH_GATEWAY_API_KEY_ENV (`rollmesh run --api-key-env`) names"
        )

    def _unary(self) -> unary_http.UnaryHttpPool:
        if self._unary_pool is None:
            self._unary_pool = unary_http.UnaryHttpPool(
                self.base_url,
                headers={**self._auth_headers(), "Accept": "application/json"},
                connect_timeout_s=self._timeout.sock_connect or 10.0,
                read_timeout_s=self._timeout.sock_read or 600.0,
                max_connections=self._max_connections,
            )
        return self._unary_pool

    async def start(self) -> None:
        """Check the server answers `/models` with the key and lists the model (when it lists any),
        and learn the context length when it says (vLLM does). A wrong key, a model the server does
        not serve, or a base URL missing its `/v1` fail here, once, not on every later call."""
        _lift_open_files_limit()
        try:
            timeout = aiohttp.ClientTimeout(total=10.0)
            async with self._http().get(f"{self.base_url}/models", timeout=timeout) as resp:
                status = resp.status
                body = await resp.read() if status == 200 else b"{}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._transport_error(exc) from None
        try:
            listing = untrusted_json.loads(body)
        except ValueError:
            listing = None
        if not isinstance(listing, dict) or not isinstance(listing.get("data", []), list):
            raise errors.UpstreamBadResponse(
                f"{self.base_url}/models answered 200 with something that is not a model list: {body[:200]!r}"
            )
        meta = {"http_status": str(status)}
        if status in (401, 403):
            raise errors.UpstreamAuthFailed(f"{self.base_url} {self._refused(status)}", metadata=meta)
        if status == 404 and not self.base_url.endswith("/v1"):
            raise errors.UpstreamRejected(
                f"{self.base_url}/models answered HTTP 404: an OpenAI-compatible base URL ends in /v1"
                f" (try {self.base_url}/v1)",
                metadata=meta,
            )
        self._healthy = status == 200
        if not self._healthy:
            log.warning("openai_backend_models_failed", base_url=self.base_url, status=status)
            return
        served = {str(item.get("id")): item for item in listing.get("data", []) if isinstance(item, dict)}
        if served and self.remote_model not in served and not await self._retrievable(self.remote_model):
            raise errors.ModelNotFound(
                f"{self.base_url} serves no model {self.remote_model!r};"
                f" it serves: {', '.join(sorted(served))}",
                metadata={"model": self.remote_model, "served": ",".join(sorted(served))},
            )
        item = served.get(self.remote_model, {})
        if isinstance(item.get("max_model_len"), int):
            self._max_model_len = self._max_model_len or int(item["max_model_len"])

    async def _retrievable(self, model: str) -> bool:
        """`GET /models/{model}` answers 200: a server that resolves names it does not list (an
        alias, a default tag such as Ollama's `:latest`) serves it. vLLM has no such route (404)."""
        timeout = aiohttp.ClientTimeout(total=10.0)
        try:
            async with self._http().get(
                f"{self.base_url}/models/{quote(model, safe='')}", timeout=timeout
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _body(self, request: EngineRequest) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.remote_model,
            "messages": list(request.messages),
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
            "return_token_ids": True,  # vLLM extension: prompt_token_ids + per-choice token_ids
        }
        if request.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = list(request.tools)
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.logprobs:
            body["logprobs"] = True
        if s.top_k > 0:
            body["top_k"] = s.top_k  # vLLM extension
        if s.ignore_eos:
            body["ignore_eos"] = True  # vLLM extension
        if request.session_id:
            body["user"] = request.session_id
        return body

    def _headers(self, request: EngineRequest) -> dict[str, str]:
        headers = {"X-Request-Id": request.request_id}
        if request.session_id:
            headers["X-Session-Id"] = request.session_id
        return headers

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        rid = request.request_id
        self._running[rid] = None
        try:
            if request.stream:
                async for chunk in self._generate_stream(request):
                    yield chunk
            else:
                yield await self._generate_unary(request)
        finally:
            self._running.pop(rid, None)
            self._aborted.discard(rid)

    # -- unary: one POST, one chunk ----------------------------------------------------------

    async def _generate_unary(self, request: EngineRequest) -> EngineChunk:
        """One POST in the caller's task (no task of its own per call): `abort` cancels that task,
        and the cancellation it caused (only that one) becomes an "abort" chunk here."""
        rid = request.request_id
        task = asyncio.current_task()
        self._running[rid] = task
        data = json.dumps(self._body(request)).encode()
        try:
            answer = await self._unary().post("/chat/completions", data, self._headers(request))
        except asyncio.CancelledError:
            if rid in self._aborted and task is not None and task.cancelling() == 1:
                task.uncancel()
                return EngineChunk(finish_reason="abort", replica_id=self.replica_id)
            raise
        except Exception as exc:
            raise self._transport_error(exc) from None
        finally:
            self._running[rid] = None
        if answer.status != 200:
            self._raise_for_status(answer.status, answer.headers.get("retry-after"), answer.body)
        self._healthy = True
        return self._unary_chunk(answer.body)

    def _unary_chunk(self, body: bytes) -> EngineChunk:
        """The one chunk of a chat completion, or UPSTREAM_BAD_RESPONSE naming what is wrong with `body`."""
        try:
            payload = untrusted_json.loads(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise errors.UpstreamBadResponse(
                f"{self.base_url}: the answer is not a JSON object: {body[:200]!r}"
            )
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise errors.UpstreamBadResponse(f"{self.base_url}: the answer has no choices: {body[:200]!r}")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise errors.UpstreamBadResponse(
                f"{self.base_url}: the answer's choice has no message: {body[:200]!r}"
            )
        try:
            calls = {
                i: {"name": (tc.get("function") or {}).get("name") or "", "arguments": _arguments(tc)}
                for i, tc in enumerate(message.get("tool_calls") or [])
            }
            prompt_tokens, completion_tokens = _usage(payload)
            return EngineChunk(
                token_ids=tuple(choice.get("token_ids") or ()),
                logprobs=_logprobs(choice),
                text=content_text(message.get("content"), strict=True) + _render_calls(calls),
                finish_reason=_finish_reason(choice.get("finish_reason"), self.base_url),
                replica_id=self.replica_id,
                prompt_token_ids=tuple(payload.get("prompt_token_ids") or ()),
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        except _MALFORMED as exc:
            raise errors.UpstreamBadResponse(
                f"{self.base_url}: a field of the answer is malformed ({type(exc).__name__}: {exc})"
            ) from None

    # -- streaming: SSE deltas ---------------------------------------------------------------

    async def _generate_stream(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        rid = request.request_id
        calls: dict[int, dict[str, str]] = {}
        finish: EngineChunk | None = None
        usage = (0, 0)
        saw_choice = False
        data = json.dumps(self._body(request)).encode()
        try:
            resp = await self._http().post(self._chat_url, data=data, headers=self._headers(request))
        except Exception as exc:
            raise self._transport_error(exc) from None
        self._running[rid] = resp
        try:
            if resp.status != 200:
                self._raise_for_status(resp.status, resp.headers.get("Retry-After"), await resp.read())
            self._healthy = True
            done = False
            async for data_line in _sse_data(resp):
                if rid in self._aborted:
                    break
                if data_line == "[DONE]":
                    done = True
                    break
                try:
                    chunk = untrusted_json.loads(data_line)
                    saw_choice = saw_choice or bool(chunk.get("choices"))
                    if chunk.get("usage"):
                        usage = _usage(chunk)
                    outs = self._chunks(chunk, calls)
                except _MALFORMED as exc:  # not a dropped connection: retrying gets the same
                    raise errors.UpstreamBadResponse(
                        f"{self.base_url}: a streamed chunk is malformed ({type(exc).__name__}: {exc}): "
                        f"{data_line[:200]!r}"
                    ) from None
                for out in outs:
                    if out.finish_reason:
                        finish = out  # held back: the usage chunk comes after it
                    else:
                        yield out
            if not done and rid not in self._aborted:  # EOF without [DONE]: the connection was cut
                raise errors.UpstreamStreamDropped(
                    f"{self.base_url}: the stream ended without [DONE]", retry_after_s=1.0
                )
            if done and not saw_choice and rid not in self._aborted:
                raise errors.UpstreamBadResponse(f"{self.base_url}: the stream ended ([DONE]) with no choice")
        except RollmeshError:
            raise
        except Exception as exc:
            if rid not in self._aborted:
                raise self._transport_error(exc) from None
        finally:
            resp.close()
        if rid in self._aborted:
            yield EngineChunk(finish_reason="abort", replica_id=self.replica_id)
            return
        if finish is None:  # [DONE] came, but no chunk said why the answer ended
            finish = EngineChunk(
                text=_render_calls(calls), finish_reason="unknown", replica_id=self.replica_id
            )
        yield dataclasses.replace(finish, prompt_tokens=usage[0], completion_tokens=usage[1])

    def _chunks(self, chunk: dict[str, Any], calls: dict[int, dict[str, str]]) -> list[EngineChunk]:
        out: list[EngineChunk] = []
        prompt_ids = tuple(chunk.get("prompt_token_ids") or ())
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(int(tc.get("index", 0)), {"name": "", "arguments": ""})
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            text = content_text(delta.get("content"), strict=True)
            reason = choice.get("finish_reason")
            if reason:
                text += _render_calls(calls)
                reason = _finish_reason(reason, self.base_url)
            out.append(
                EngineChunk(
                    token_ids=tuple(choice.get("token_ids") or ()),
                    logprobs=_logprobs(choice),
                    text=text,
                    finish_reason=reason,
                    replica_id=self.replica_id,
                    prompt_token_ids=prompt_ids,
                )
            )
            prompt_ids = ()
        if not out and prompt_ids:
            out.append(EngineChunk(replica_id=self.replica_id, prompt_token_ids=prompt_ids))
        return out

    def _transport_error(self, exc: BaseException) -> RollmeshError:
        """The gateway error for a failure below HTTP (the connection, or the wait for bytes)."""
        where = self.base_url
        if isinstance(exc, errors.ConnectFailed):
            self._healthy = False
            return errors.UpstreamUnreachable(f"{where}: {exc}", retry_after_s=1.0)
        if isinstance(exc, errors.ConnectTimedOut | aiohttp.ConnectionTimeoutError):
            # aiohttp's is a TimeoutError too, but no answer was due
            return errors.UpstreamUnreachable(
                f"{where}: no connection within {self._timeout.sock_connect:g} s (the server, or this "
                "host, is overloaded or the address is unreachable)",
                retry_after_s=1.0,
            )
        if isinstance(exc, errors.ReadTimedOut | TimeoutError):  # aiohttp's read timeouts too
            return errors.UpstreamTimeout(
                f"{where}: no answer within the read timeout ({self._timeout.sock_read:g} s)",
                retry_after_s=1.0,
            )
        if isinstance(exc, errors.AnswerTooLarge):
            return errors.UpstreamBadResponse(f"{where}: {exc}")
        if isinstance(exc, errors.ConnectionBroke):
            return errors.UpstreamStreamDropped(f"{where}: the connection broke: {exc}", retry_after_s=1.0)
        if isinstance(exc, aiohttp.ClientConnectorError):
            self._healthy = False
            return errors.UpstreamUnreachable(f"{where}: cannot connect: {exc}", retry_after_s=1.0)
        if isinstance(exc, aiohttp.ClientError | ConnectionError | ValueError):
            return errors.UpstreamStreamDropped(f"{where}: the connection broke: {exc!r}", retry_after_s=1.0)
        return errors.UpstreamStreamDropped(f"{where}: the call failed: {exc!r}", retry_after_s=1.0)

    def _raise_for_status(self, status: int, retry_after: str | None, answer: bytes) -> None:
        """The gateway error for an HTTP status other than 200 (`retry_after`: the header's value)."""
        body = answer.decode(errors="replace")[:500]
        try:
            message = str(json.loads(body)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = body
        meta = {"http_status": str(status)}
        where = self.base_url
        retry = _retry_after(retry_after)
        if status >= 500:
            self._healthy = status not in (502, 503, 504)
            raise errors.UpstreamHttpError(
                f"{where} answered HTTP {status}: {message}", metadata=meta, retry_after_s=retry
            )
        if status == 429:
            raise errors.UpstreamRateLimited(
                f"{where} is rate limiting (HTTP 429): {message}", metadata=meta, retry_after_s=retry
            )
        if status == 408:
            raise errors.UpstreamTimeout(f"{where} timed out (HTTP 408): {message}", metadata=meta)
        if status in (401, 403):
            raise errors.UpstreamAuthFailed(f"{where} {self._refused(status)}: {message}", metadata=meta)
        if status == 404:
            raise errors.ModelNotFound(
                f"{where} has no model {self.remote_model!r}: {message}",
                metadata={**meta, "model": self.remote_model},
            )
        raise errors.UpstreamRejected(
            f"{where} rejected the request (HTTP {status}): {message}", metadata=meta
        )

    async def abort(self, request_id: str) -> bool:
        if request_id not in self._running:
            return False
        self._aborted.add(request_id)
        running = self._running.get(request_id)
        if isinstance(running, asyncio.Task):
            running.cancel()
        elif running is not None:
            # Closing the connection is how an OpenAI server (vLLM) learns to abort the request.
            running.close()
        return True

    async def replicas(self) -> list[ReplicaStatus]:
        return [
            ReplicaStatus(replica_id=self.replica_id, healthy=self._healthy, in_flight=len(self._running))
        ]

    async def shutdown(self) -> None:
        if self._unary_pool is not None:
            await self._unary_pool.close()
            self._unary_pool = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def _lift_open_files_limit() -> None:
    """Every request in flight holds a socket: raise the soft open-files limit to the hard one (as
    Ray and vLLM do at start), so a concurrency of thousands is not cut short at 1,024."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError) as exc:  # not on this platform, or not allowed
        log.info("open_files_limit_unchanged", error=str(exc))


def _arguments(tool_call: dict[str, Any]) -> str:
    args = (tool_call.get("function") or {}).get("arguments")
    return args if isinstance(args, str) else json.dumps(args or {})


def _retry_after(value: str | None) -> float:
    """Seconds from a Retry-After header (delta-seconds; an HTTP date or junk gives 1 s)."""
    try:
        return max(0.0, float(value)) if value else 1.0
    except ValueError:
        return 1.0


async def _sse_data(
    resp: aiohttp.ClientResponse, max_line_bytes: int = unary_http.MAX_BODY_BYTES
) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent-event stream, lines up to `max_line_bytes` (a longer
    one is UPSTREAM_BAD_RESPONSE: a hostile or broken server cannot exhaust the gateway's memory).
    Each byte is scanned once, however long the line."""
    pending: list[bytes] = []  # the current line's pieces so far
    pending_bytes = 0
    async for block in resp.content.iter_any():
        *lines, rest = block.split(b"\n")
        if lines:
            lines[0] = b"".join([*pending, lines[0]])
            pending, pending_bytes = [], 0
        for raw in lines:
            if raw.startswith(b"data:"):
                yield raw[5:].strip().decode()
        if rest:
            pending.append(rest)
            pending_bytes += len(rest)
            if pending_bytes > max_line_bytes:
                raise errors.UpstreamBadResponse(
                    f"{resp.url}: a server-sent event line over {max_line_bytes} bytes"
                )
    tail = b"".join(pending)
    if tail.startswith(b"data:"):
        yield tail[5:].strip().decode()
