"""A backend over any OpenAI-compatible `/v1/chat/completions` endpoint (e.g. a pre-hosted vLLM).

`supports_token_ids = False`: the remote server renders the chat template and tokenizes, so the
gateway sends messages and cannot build prompts from kept ids. Token-exact multi-turn (and
`prompt_token_ids` input) needs a token-id backend (ray-serve, fake). When the server is vLLM, the
request asks for its `return_token_ids` extension, so responses still carry the prompt and output
ids the server used; other servers ignore the field and the ids stay empty.

Tool calls the server returns as structured `tool_calls` are re-rendered as
`<tool_call>{"name": ..., "arguments": ...}</tool_call>` text, so the gateway parses every backend's
output the same way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx

from rollmesh.gateway import errors
from rollmesh.gateway.backend import (
    BackendUnavailable,
    EngineChunk,
    EngineRequest,
    ModelBackend,
    ModelCard,
    ReplicaStatus,
)
from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.gateway.openai")

_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}


def _render_calls(calls: dict[int, dict[str, str]]) -> str:
    parts = []
    for _, c in sorted(calls.items()):
        args = c.get("arguments") or "{}"
        parts.append(
            f'<tool_call>{{"name": {json.dumps(c.get("name", ""))}, "arguments": {args}}}</tool_call>'
        )
    return "".join(parts)


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
        request_token_ids: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.remote_model = model or name
        self._api_key = api_key
        self._max_model_len = max_model_len
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._request_token_ids = request_token_ids
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._healthy = False
        self._running: dict[str, httpx.Response | None] = {}
        self._aborted: set[str] = set()
        self.replica_id = urlsplit(self.base_url).netloc or self.base_url

    @property
    def card(self) -> ModelCard:
        return ModelCard(
            name=self.name,
            backend="openai",
            max_model_len=self._max_model_len,
            extra={"base_url": self.base_url, "remote_model": self.remote_model},
        )

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=self._timeout, transport=self._transport
            )
        return self._client

    async def start(self) -> None:
        """Check the server answers `/models`, and learn the context length when it says (vLLM does)."""
        try:
            resp = await self._http().get("/models", timeout=10.0)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"{self.base_url}/models: {exc!r}", retry_after_s=2.0) from None
        if resp.status_code in (401, 403):
            raise errors.UpstreamAuthFailed(f"{self.base_url} refused the API key (HTTP {resp.status_code})")
        self._healthy = resp.status_code == 200
        if not self._healthy:
            log.warning("openai_backend_models_failed", base_url=self.base_url, status=resp.status_code)
            return
        for item in resp.json().get("data", []):
            if item.get("id") == self.remote_model and isinstance(item.get("max_model_len"), int):
                self._max_model_len = self._max_model_len or int(item["max_model_len"])

    async def check_health(self) -> bool:
        try:
            resp = await self._http().get("/models", timeout=5.0)
            self._healthy = resp.status_code == 200
        except httpx.HTTPError:
            self._healthy = False
        return self._healthy

    def _body(self, request: EngineRequest) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.remote_model,
            "messages": list(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_tokens": s.max_tokens,
        }
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
        if self._request_token_ids:
            body["return_token_ids"] = True  # vLLM extension: prompt_token_ids + per-choice token_ids
        if request.session_id:
            body["user"] = request.session_id
        return body

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        rid = request.request_id
        headers = {"X-Request-Id": rid}
        if request.session_id:
            headers["X-Session-Id"] = request.session_id
        self._running[rid] = None
        calls: dict[int, dict[str, str]] = {}
        finish: str | None = None
        try:
            try:
                req = self._http().build_request(
                    "POST", "/chat/completions", json=self._body(request), headers=headers
                )
                resp = await self._http().send(req, stream=True)
            except httpx.HTTPError as exc:
                self._healthy = False
                raise BackendUnavailable(f"{self.base_url}: {exc!r}", retry_after_s=1.0) from None
            self._running[rid] = resp
            try:
                if resp.status_code != 200:
                    await self._raise_for(resp)
                self._healthy = True
                async for line in resp.aiter_lines():
                    if rid in self._aborted:
                        break
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    for out in self._chunks(chunk, calls):
                        if out.finish_reason:
                            finish = out.finish_reason
                        yield out
            except (httpx.StreamError, httpx.TransportError) as exc:
                if rid not in self._aborted:
                    self._healthy = False
                    raise BackendUnavailable(
                        f"{self.base_url}: stream broke: {exc!r}", retry_after_s=1.0
                    ) from None
            finally:
                await resp.aclose()
            if rid in self._aborted:
                yield EngineChunk(finish_reason="abort", replica_id=self.replica_id)
            elif finish is None:
                yield EngineChunk(text=_render_calls(calls), finish_reason="stop", replica_id=self.replica_id)
        finally:
            self._running.pop(rid, None)
            self._aborted.discard(rid)

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
            lp = choice.get("logprobs") or {}
            text = delta.get("content") or ""
            reason = choice.get("finish_reason")
            if reason:
                text += _render_calls(calls)
                reason = "length" if reason == "length" else ("abort" if reason == "abort" else "stop")
            out.append(
                EngineChunk(
                    token_ids=tuple(choice.get("token_ids") or ()),
                    logprobs=tuple(float(x["logprob"]) for x in lp.get("content") or ()),
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

    async def _raise_for(self, resp: httpx.Response) -> None:
        body = (await resp.aread()).decode(errors="replace")[:500]
        try:
            message = str(json.loads(body)["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = body
        status = resp.status_code
        if status in _RETRYABLE_STATUS:
            self._healthy = status not in (502, 503, 504)
            retry = float(resp.headers.get("retry-after", "1") or 1)
            raise BackendUnavailable(
                f"{self.base_url} answered HTTP {status}: {message}", retry_after_s=retry
            )
        if status in (401, 403):
            raise errors.UpstreamAuthFailed(f"{self.base_url} refused the API key (HTTP {status}): {message}")
        if status == 404:
            raise errors.ModelNotFound(f"{self.base_url} has no model {self.remote_model!r}: {message}")
        raise errors.UpstreamRejected(f"{self.base_url} rejected the request (HTTP {status}): {message}")

    async def abort(self, request_id: str) -> bool:
        if request_id not in self._running:
            return False
        self._aborted.add(request_id)
        resp = self._running.get(request_id)
        if resp is not None:
            # Closing the stream is how an OpenAI server (vLLM) learns to abort the request.
            await asyncio.shield(resp.aclose())
        return True

    async def replicas(self) -> list[ReplicaStatus]:
        return [
            ReplicaStatus(replica_id=self.replica_id, healthy=self._healthy, in_flight=len(self._running))
        ]

    async def shutdown(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
