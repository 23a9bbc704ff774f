"""An OpenAI-compatible upstream that answers 200 with something that is not a chat completion
(not JSON, a JSON list, no or empty `choices`, a choice without `message`, a stream that ends with
no choice) fails the call with UPSTREAM_BAD_RESPONSE: it never becomes an empty answer that a
verifier would score 0 as if the model had said it. A well-formed empty answer stays an answer.
End to end, `rollmesh run --base-url` against such a server ends FAILED (exit 4) with that class."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from aiohttp import web

from rollmesh.gateway import Gateway, GenerateInput, GenerateResult, Message
from rollmesh.gateway.backends.openai import OpenAIBackend
from rollmesh.mesh.errors import RollmeshError
from tests.http_apps import serve_app
from tests.procs import ROLLMESH

USAGE = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
UNARY_BODIES: dict[str, bytes] = {
    "not_json": b"<html>a login page</html>",
    "empty_body": b"",
    "json_list": b"[1, 2, 3]",
    "no_choices": json.dumps({"id": "x", "model": "m", "usage": USAGE}).encode(),
    "empty_choices": json.dumps({"id": "x", "model": "m", "choices": [], "usage": USAGE}).encode(),
    "no_message": json.dumps({"choices": [{"index": 0, "finish_reason": "stop"}], "usage": USAGE}).encode(),
}
EMPTY_ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "stop"}]
}


async def _chat(request: web.Request) -> web.StreamResponse:
    mode = request.match_info["mode"]
    body = await request.json()
    if not body.get("stream"):
        if mode == "empty_answer":
            return web.json_response({**EMPTY_ANSWER, "usage": USAGE})
        return web.Response(body=UNARY_BODIES[mode], content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"id": "x", "choices": []}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "m", "max_model_len": 4096}]})


@pytest_asyncio.fixture
async def bad_upstream() -> AsyncIterator[str]:
    """Base URL http://HOST:PORT (append /<mode>/v1)."""
    app = web.Application()
    app.router.add_get("/{mode}/v1/models", _models)
    app.router.add_post("/{mode}/v1/chat/completions", _chat)
    async with serve_app(app) as origin:
        yield origin


async def _generate(base: str, mode: str, *, stream: bool) -> GenerateResult:
    gw = Gateway([OpenAIBackend("m", base_url=f"{base}/{mode}/v1", model="m")])
    await gw.start()
    try:
        inp = GenerateInput(messages=(Message("user", "What is 2 + 3?"),))
        if not stream:
            return await gw.generate(inp)
        async for item in gw.generate_stream(inp, deltas=True):
            if isinstance(item, GenerateResult):
                return item
        raise AssertionError("no result")
    finally:
        await gw.shutdown()


@pytest.mark.parametrize("mode", sorted(UNARY_BODIES))
async def test_a_200_that_is_not_a_chat_completion_is_a_bad_response(bad_upstream: str, mode: str) -> None:
    with pytest.raises(RollmeshError) as info:
        await _generate(bad_upstream, mode, stream=False)
    assert (info.value.code, info.value.reason) == (grpc.StatusCode.INTERNAL, "UPSTREAM_BAD_RESPONSE")
    assert bad_upstream in info.value.message


async def test_a_stream_with_no_choice_is_a_bad_response(bad_upstream: str) -> None:
    with pytest.raises(RollmeshError) as info:
        await _generate(bad_upstream, "any", stream=True)
    assert info.value.reason == "UPSTREAM_BAD_RESPONSE" and "no choice" in info.value.message


async def test_a_well_formed_empty_answer_is_still_an_answer(bad_upstream: str) -> None:
    result = await _generate(bad_upstream, "empty_answer", stream=False)
    assert result.message.content == "" and result.finish_reason == "stop"


async def test_rollmesh_run_against_it_fails_with_the_class(bad_upstream: str, tmp_path: Path) -> None:
    argv = [str(ROLLMESH), "run", "--benchmark", "arithmetic", "--limit", "2", "-n", "1"]
    argv += ["--base-url", f"{bad_upstream}/empty_choices/v1", "--model", "m"]
    argv += ["--output-dir", str(tmp_path), "--json"]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 4, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["state"] == "FAILED"
    assert [f["error_class"] for f in result["failure_summary"]] == ["UPSTREAM_BAD_RESPONSE"]
    assert "Traceback" not in done.stderr
    written = await asyncio.to_thread(_text, Path(result["paths"]["rollouts.jsonl"]))
    assert written == ""  # no reward-0 row for an answer never given


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""
