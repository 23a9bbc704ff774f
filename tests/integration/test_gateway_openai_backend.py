"""The openai backend against a real OpenAI-compatible server: another gateway's HTTP facade.

Gateway A (openai backend, message-only) -> HTTP -> gateway B's facade (FakeBackend). Also a
RegisterRoute to a URL, and upstream errors mapped to gateway errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import Message
from rollmesh.gateway.backends.factory import create_backend
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.gateway.backends.openai import OpenAIBackend
from rollmesh.gateway.http import HttpFacade
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.errors import RollmeshError
from tests.http_apps import serve_app

CALL = '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 7}}</tool_call>'


@pytest_asyncio.fixture
async def upstream() -> AsyncIterator[tuple[str, FakeBackend]]:
    fb = FakeBackend("tiny", script=lambda p, r: "Adding." + CALL if "tool" in p[-40:] else "plain answer")
    gw = Gateway([fb])
    await gw.start()
    facade = HttpFacade(gw, port=0)
    await facade.start()
    try:
        yield facade.base_url, fb
    finally:
        await facade.stop()
        await gw.shutdown()


async def test_generate_through_an_openai_url(upstream: tuple[str, FakeBackend]) -> None:
    url, fb = upstream
    backend = OpenAIBackend("remote", base_url=url, model="tiny")
    gw = Gateway([backend])
    await gw.start()
    try:
        assert backend.card.max_model_len == 4096  # learned from /v1/models
        r = await gw.generate(GenerateInput(messages=(Message("user", "hi"),), session_id="s"))
        assert r.message.content == "plain answer" and r.finish_reason == "stop"
        # the upstream's return_token_ids extension carried the ids through
        assert FakeTokenizer().decode(list(r.output_token_ids)) == "plain answer<|end|>"
        assert r.prompt_token_ids == fb.requests[-1].prompt_token_ids

        r = await gw.generate(
            GenerateInput(messages=(Message("user", "use the tool"),), tools=(ToolSpec("add", "", "{}"),))
        )
        assert r.finish_reason == "tool_calls" and r.message.content == "Adding."
        assert [(c.name, c.arguments_json) for c in r.message.tool_calls] == [("add", '{"a": 5, "b": 7}')]

        (m,) = await gw.list_models()
        assert m.backend == "openai" and m.replicas[0].healthy
    finally:
        await gw.shutdown()


async def test_register_route_to_a_url(upstream: tuple[str, FakeBackend]) -> None:
    url, _ = upstream
    gw = Gateway([FakeBackend("local")], backend_factory=create_backend)
    await gw.start()
    try:
        info = await gw.register_route("judge", target_model="tiny", base_url=url)
        assert info.backend == "openai"
        r = await gw.generate(GenerateInput(model="judge", messages=(Message("user", "hi"),)))
        assert r.message.content == "plain answer" and r.model == "judge"
    finally:
        await gw.shutdown()


async def test_upstream_errors_map_to_gateway_errors(upstream: tuple[str, FakeBackend]) -> None:
    url, fb = upstream
    msgs = (Message("user", "hi"),)
    cases = [
        (OpenAIBackend("x", base_url=url, model="missing"), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
        (
            OpenAIBackend("y", base_url="http://127.0.0.1:9/v1"),
            grpc.StatusCode.UNAVAILABLE,
            "UPSTREAM_UNREACHABLE",
        ),
    ]
    for backend, code, reason in cases:
        gw = Gateway([backend])
        with pytest.raises(RollmeshError) as exc:
            await gw.generate(GenerateInput(messages=msgs))
        assert (exc.value.code, exc.value.reason) == (code, reason)
        await gw.shutdown()
    fb.down = True  # the upstream answers 503 -> UNAVAILABLE with RetryInfo
    gw = Gateway([OpenAIBackend("z", base_url=url, model="tiny")])
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(GenerateInput(messages=msgs))
    assert (exc.value.code, exc.value.reason) == (grpc.StatusCode.UNAVAILABLE, "UPSTREAM_HTTP_ERROR")
    assert exc.value.metadata["http_status"] == "503"
    assert exc.value.retry_after_s == 1.0
    await gw.shutdown()


async def test_start_fails_fast_when_the_url_is_down() -> None:
    backend = OpenAIBackend("down", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(RollmeshError) as exc:
        await backend.start()
    assert (exc.value.code, exc.value.reason) == (grpc.StatusCode.UNAVAILABLE, "UPSTREAM_UNREACHABLE")
    await backend.shutdown()


@pytest_asyncio.fixture
async def tagged_upstream() -> AsyncIterator[str]:
    """A server that lists `llama3:latest` and resolves the untagged name (as Ollama does)."""
    from aiohttp import web

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "llama3:latest", "object": "model"}]})

    async def model(request: web.Request) -> web.Response:
        if request.match_info["name"] in ("llama3", "llama3:latest"):
            return web.json_response({"id": "llama3:latest", "object": "model"})
        return web.json_response({"error": {"message": "model not found"}}, status=404)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{name}", model)
    async with serve_app(app) as origin:
        yield f"{origin}/v1"


async def test_start_refuses_a_model_the_server_neither_lists_nor_resolves(
    upstream: tuple[str, FakeBackend], tagged_upstream: str
) -> None:
    url, _ = upstream
    missing = OpenAIBackend("x", base_url=url, model="missing")
    with pytest.raises(RollmeshError) as exc:
        await missing.start()
    assert (exc.value.code, exc.value.reason) == (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND")
    assert "serves no model 'missing'; it serves: tiny" in exc.value.message
    await missing.shutdown()
    aliased = OpenAIBackend("l", base_url=tagged_upstream, model="llama3")
    await aliased.start()  # not listed under that name, but the server resolves it
    await aliased.shutdown()
    other = OpenAIBackend("o", base_url=tagged_upstream, model="mistral")
    with pytest.raises(RollmeshError, match="it serves: llama3:latest"):
        await other.start()
    await other.shutdown()
