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

from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import GenerateResult
from rollmesh.gateway import Message
from rollmesh.gateway.backends.openai import OpenAIBackend
from rollmesh.mesh.errors import RollmeshError
from rollmesh.scheduler.retry import classify
from tests.http_apps import serve_app
from tests.procs import ROLLMESH

USAGE = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
UNARY_BODIES: dict[str, bytes] = {
    "not_json": b"<html>a login page</html>",
    "empty_body": b"",
    "json_list": b"[1, 2, 3]",
    "nested_too_deeply": b"[" * 100_000 + b"]" * 100_000,  # was RecursionError: INTERNAL
    "no_choices": json.dumps({"id": "x", "model": "m", "usage": USAGE}).encode(),
    "empty_choices": json.dumps({"id": "x", "model": "m", "choices": [], "usage": USAGE}).encode(),
    "no_message": json.dumps({"choices": [{"index": 0, "finish_reason": "stop"}], "usage": USAGE}).encode(),
}
EMPTY_ANSWER = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": "stop"}]
}
SAID = {"role": "assistant", "content": "The answer is 5."}


def _answer(message: dict[str, object] = SAID, finish: str = "stop", **extra: object) -> dict[str, object]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish, **extra}], "usage": USAGE}


# A field of the wrong type was a Python error inside the gateway (INTERNAL, a traceback in its log).
MALFORMED: dict[str, dict[str, object]] = {
    "usage_not_a_number": {**_answer(), "usage": {"prompt_tokens": "many", "completion_tokens": 3}},
    "usage_a_list": {**_answer(), "usage": [1, 2]},
    "content_a_number": _answer({"role": "assistant", "content": 5}),
    "tool_call_a_string": _answer({"role": "assistant", "content": None, "tool_calls": ["f"]}, "tool_calls"),
    "tool_function_a_string": _answer(
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": "f"}]}, "tool_calls"
    ),
    "logprob_not_a_number": _answer(logprobs={"content": [{"logprob": "x"}]}),
}
CHUNK = b'data: {"choices": [{"index": 0, "delta": {"content": "The answer is 5"}}]}\n\n'
MALFORMED_STREAMS: dict[str, list[bytes]] = {
    "line_not_json": [CHUNK, b"data: {not json\n\n", b"data: [DONE]\n\n"],
    "line_nested_too_deeply": [
        CHUNK,
        b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n",
        b"data: [DONE]\n\n",
    ],
    "delta_a_string": [b'data: {"choices": [{"index": 0, "delta": "x"}]}\n\n', b"data: [DONE]\n\n"],
    "choices_an_object": [b'data: {"choices": {"a": 1}}\n\n', b"data: [DONE]\n\n"],
}
FILTERED_STREAM = [
    b'data: {"choices": [{"index": 0, "delta": {"content": "The answer is 5"}, '
    b'"finish_reason": "content_filter"}]}\n\n',
    b"data: [DONE]\n\n",
]


async def _chat(request: web.Request) -> web.StreamResponse:
    mode = request.match_info["mode"]
    body = await request.json()
    if not body.get("stream"):
        if mode == "empty_answer":
            return web.json_response({**EMPTY_ANSWER, "usage": USAGE})
        if mode == "content_filter":
            return web.json_response(_answer(finish="content_filter"))
        if mode == "content_parts":
            return web.json_response(
                _answer({"role": "assistant", "content": [{"type": "text", "text": "5"}]})
            )
        if mode in MALFORMED:
            return web.json_response(MALFORMED[mode])
        return web.Response(body=UNARY_BODIES[mode], content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    parts = MALFORMED_STREAMS.get(mode) or (FILTERED_STREAM if mode == "content_filter" else None)
    for part in parts or [b'data: {"id": "x", "choices": []}\n\n', b"data: [DONE]\n\n"]:
        await resp.write(part)
    return resp


MODEL_LISTS: dict[str, bytes] = {  # a /models answer that is 200 but no model list
    "models_not_json": b"<html>a login page</html>",
    "models_a_list": b"[1, 2]",
    "models_data_a_number": b'{"object": "list", "data": 5}',
}


async def _models(request: web.Request) -> web.Response:
    if (mode := request.match_info["mode"]) in MODEL_LISTS:
        return web.Response(body=MODEL_LISTS[mode], content_type="application/json")
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


@pytest.mark.parametrize("mode", sorted(MODEL_LISTS))
async def test_a_model_list_that_is_not_one_fails_the_start_with_the_class(
    bad_upstream: str, mode: str
) -> None:
    """It was an uncaught ValueError/TypeError/AttributeError: a traceback instead of a reason."""
    backend = OpenAIBackend("m", base_url=f"{bad_upstream}/{mode}/v1", model="m")
    try:
        with pytest.raises(RollmeshError) as info:
            await backend.start()
    finally:
        await backend.shutdown()
    assert info.value.reason == "UPSTREAM_BAD_RESPONSE" and "not a model list" in info.value.message


async def test_rollmesh_run_against_a_bad_model_list_says_so_in_one_line(
    bad_upstream: str, tmp_path: Path
) -> None:
    argv = [str(ROLLMESH), "run", "--benchmark", "arithmetic", "--limit", "2", "-n", "1"]
    argv += ["--base-url", f"{bad_upstream}/models_a_list/v1", "--model", "m", "--output-dir", str(tmp_path)]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "not a model list" in done.stderr


async def test_a_stream_with_no_choice_is_a_bad_response(bad_upstream: str) -> None:
    with pytest.raises(RollmeshError) as info:
        await _generate(bad_upstream, "any", stream=True)
    assert info.value.reason == "UPSTREAM_BAD_RESPONSE" and "no choice" in info.value.message


async def test_a_well_formed_empty_answer_is_still_an_answer(bad_upstream: str) -> None:
    result = await _generate(bad_upstream, "empty_answer", stream=False)
    assert result.message.content == "" and result.finish_reason == "stop"


@pytest.mark.parametrize(
    ("mode", "stream"),
    [(m, False) for m in sorted(MALFORMED)] + [(m, True) for m in sorted(MALFORMED_STREAMS)],
)
async def test_a_field_of_the_wrong_type_is_a_bad_response(
    bad_upstream: str, mode: str, stream: bool
) -> None:
    """Not an internal error (unary), nor UPSTREAM_STREAM_DROPPED (streamed: retried against a
    server that sends the same garbage again)."""
    with pytest.raises(RollmeshError) as info:
        await _generate(bad_upstream, mode, stream=stream)
    assert info.value.reason == "UPSTREAM_BAD_RESPONSE", info.value
    said = "a streamed chunk is malformed" if stream else "a field of the answer is malformed"
    assert said in info.value.message


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_cut_by_a_content_filter_is_never_an_answer(bad_upstream: str, stream: bool) -> None:
    """ "The answer is 5" followed by finish_reason content_filter is half an answer: scoring it as
    the model's (it was read as finish_reason "stop") would reward what the server withheld."""
    with pytest.raises(RollmeshError) as info:
        await _generate(bad_upstream, "content_filter", stream=stream)
    assert info.value.reason == "UPSTREAM_CONTENT_FILTERED", info.value
    assert not classify(info.value).retryable


async def test_content_given_as_text_parts_is_read_as_text(bad_upstream: str) -> None:
    result = await _generate(bad_upstream, "content_parts", stream=False)
    assert result.message.content == "5" and result.finish_reason == "stop"


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
