"""The official `openai` client against the gateway's HTTP facade (FakeBackend, ephemeral port)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import openai
import pytest
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.gateway.http import HttpFacade
from rollmesh.gateway.sessions import naive_prompt_ids
from rollmesh.mesh.chat import Message

CALL = '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 7}}</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "description": "adds", "parameters": {"type": "object"}},
    }
]


def script(prompt: str, request: object) -> str | list[int]:
    last_user = prompt.rsplit("<|user|>\n", 1)[-1].split("<|end|>", 1)[0]
    if "tool" in last_user:
        return "Let me add." + CALL
    if "5+7" in last_user:
        return FakeTokenizer.char_ids("12")  # a non-canonical tokenization of "12"
    return last_user


class Http:
    def __init__(self, client: openai.AsyncOpenAI, backend: FakeBackend, gateway: Gateway, url: str) -> None:
        self.client, self.backend, self.gateway, self.url = client, backend, gateway, url


@pytest_asyncio.fixture
async def http() -> AsyncIterator[Http]:
    backend = FakeBackend("tiny", script=script, max_model_len=512)
    gateway = Gateway([backend])
    await gateway.start()
    facade = HttpFacade(gateway, host="127.0.0.1", port=0)
    await facade.start()
    client = openai.AsyncOpenAI(base_url=facade.base_url, api_key="unused", max_retries=0, timeout=20)
    try:
        yield Http(client, backend, gateway, facade.base_url)
    finally:
        await client.close()
        await facade.stop()
        await gateway.shutdown()


async def test_models(http: Http) -> None:
    page = await http.client.models.list()
    assert [m.id for m in page.data] == ["tiny"]
    extra = page.data[0].model_extra or {}
    assert extra["max_model_len"] == 512 and extra["rollmesh"]["is_default"] is True
    one = await http.client.models.retrieve("tiny")
    assert one.id == "tiny" and (one.model_extra or {})["max_model_len"] == 512
    with pytest.raises(openai.NotFoundError) as exc:
        await http.client.models.retrieve("missing")
    assert exc.value.code == "MODEL_NOT_FOUND"


async def test_chat_completion_with_token_ids(http: Http) -> None:
    r = await http.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}], temperature=0, logprobs=True
    )
    choice = r.choices[0]
    assert choice.message.content == "hello there" and choice.finish_reason == "stop"
    extra = r.model_extra or {}
    token_ids = (choice.model_extra or {})["token_ids"]
    assert FakeTokenizer().decode(token_ids) == "hello there<|end|>"
    assert extra["prompt_token_ids"] and extra["rollmesh"]["replica_id"] == "tiny-replica-0"
    assert r.usage is not None and r.usage.completion_tokens == len(token_ids)
    assert choice.logprobs is not None and len(choice.logprobs.content or []) == len(token_ids)


async def test_chat_tool_calls(http: Http) -> None:
    r = await http.client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "use the tool"}],
        tools=TOOLS,  # type: ignore[arg-type]
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me add."
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 5, "b": 7}


async def test_streaming_chat(http: Http) -> None:
    stream = await http.client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "use the tool"}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    content, calls, finish, usage = "", [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert content == "Let me add."  # no tool-call markup leaked into the streamed content
    assert [(c.function.name if c.function else None) for c in calls] == ["add"]
    assert finish == "tool_calls"
    assert usage is not None and usage.completion_tokens > 0


async def test_streaming_chat_with_logprobs(http: Http) -> None:
    """Asked for, a stream's chunks carry the logprob of each token they carry, as a unary call's
    choice does (they were always null on a stream)."""
    messages = [{"role": "user", "content": "hello there"}]
    whole = await http.client.chat.completions.create(model="tiny", messages=messages, logprobs=True)  # type: ignore[arg-type]
    stream = await http.client.chat.completions.create(
        model="tiny",
        messages=messages,
        logprobs=True,
        stream=True,  # type: ignore[arg-type]
    )
    streamed: list[float] = []
    token_ids: list[int] = []
    async for chunk in stream:
        for c in chunk.choices:
            token_ids += (c.model_extra or {}).get("token_ids") or []
            streamed += [t.logprob for t in (c.logprobs.content if c.logprobs else None) or []]
    assert whole.choices[0].logprobs is not None
    assert streamed == [t.logprob for t in whole.choices[0].logprobs.content or []]
    assert len(streamed) == len(token_ids) > 0
    plain = await http.client.chat.completions.create(model="tiny", messages=messages, stream=True)  # type: ignore[arg-type]
    assert [c.logprobs async for chunk in plain for c in chunk.choices if c.logprobs is not None] == []


async def test_streaming_plain_text(http: Http) -> None:
    stream = await http.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "stream me"}], stream=True
    )
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(pieces) == "stream me"
    assert len([p for p in pieces if p]) > 1  # really streamed, token by token


async def test_responses(http: Http) -> None:
    r = await http.client.responses.create(model="tiny", input="hi from responses", instructions="be nice")
    assert r.output_text == "hi from responses"
    assert r.status == "completed"
    assert r.usage is not None and r.usage.output_tokens > 0

    r = await http.client.responses.create(
        model="tiny",
        input=[{"role": "user", "content": "use the tool"}],
        tools=[{"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": False}],
    )
    kinds = [o.type for o in r.output]
    assert kinds == ["message", "function_call"]
    fc = r.output[1]
    assert fc.type == "function_call" and fc.name == "add" and json.loads(fc.arguments) == {"a": 5, "b": 7}

    # function_call + function_call_output items come back as an assistant call and a tool message
    r = await http.client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "add 5 and 7"},
            {"type": "function_call", "call_id": fc.call_id, "name": "add", "arguments": fc.arguments},
            {"type": "function_call_output", "call_id": fc.call_id, "output": "12"},
        ],
    )
    prompt = FakeTokenizer().decode((r.model_extra or {})["prompt_token_ids"])
    assert "<|tool|>\n12<|end|>" in prompt and "<tool_call>" in prompt


async def test_streaming_responses(http: Http) -> None:
    stream = await http.client.responses.create(model="tiny", input="stream the responses api", stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "stream the responses api" and len(deltas) > 1  # really streamed
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "stream the responses api" and final.usage is not None

    # the SDK's stream helper rebuilds the same response from the events
    tools = [{"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": False}]
    async with http.client.responses.stream(
        model="tiny",
        input=[{"role": "user", "content": "use the tool"}],
        tools=tools,  # type: ignore[arg-type]
    ) as helper:
        texts = [e.delta async for e in helper if e.type == "response.output_text.delta"]
        r = await helper.get_final_response()
    assert "".join(texts) == "Let me add."  # no tool-call markup streamed as text
    assert [o.type for o in r.output] == ["message", "function_call"]
    fc = r.output[1]
    assert fc.type == "function_call" and json.loads(fc.arguments) == {"a": 5, "b": 7}


@pytest.mark.parametrize("finish", ["unknown", "abort", "error", "repetition"])
async def test_a_finish_reason_openai_has_no_word_for_is_not_called_complete(http: Http, finish: str) -> None:
    """The gateway's finish "unknown" (an upstream that named no reason: the answer may be cut) was
    passed on as chat's finish_reason "unknown", no OpenAI value, and /v1/responses said
    "completed"; so were "abort" (an Abort, a weight update mid-stream) and vLLM's "error" and
    "repetition". Now: chat null, Responses "incomplete" with a null reason (stream:
    response.incomplete), and rollmesh.finish_reason says which."""
    unnamed = http.backend._output_ids
    http.backend._output_ids = lambda request: (unnamed(request)[0], finish)  # type: ignore[method-assign]
    messages = [{"role": "user", "content": "hello"}]
    chat = await http.client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    assert chat.choices[0].finish_reason is None and chat.choices[0].message.content == "hello"
    assert chat.model_extra is not None and chat.model_extra["rollmesh"]["finish_reason"] == finish
    stream = await http.client.chat.completions.create(model="tiny", messages=messages, stream=True)  # type: ignore[arg-type]
    chunks = [c async for c in stream if c.choices]
    assert len(chunks) > 2 and {c.choices[0].finish_reason for c in chunks} == {None}  # the last chunk too
    assert (chunks[-1].model_extra or {})["rollmesh"]["finish_reason"] == finish
    r = await http.client.responses.create(model="tiny", input="hello")
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason is None and r.output_text == "hello"
    assert (r.model_extra or {})["rollmesh"]["finish_reason"] == finish
    events = [e async for e in await http.client.responses.create(model="tiny", input="hello", stream=True)]
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


async def test_session_header_gives_token_exact_multi_turn(http: Http) -> None:
    first = [{"role": "user", "content": "what is 5+7?"}]
    r1 = await http.client.chat.completions.create(
        model="tiny", messages=first, extra_headers={"X-Session-Id": "h1"}
    )
    kept = (r1.model_extra or {})["prompt_token_ids"] + (r1.choices[0].model_extra or {})["token_ids"]
    convo = [
        *first,
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "ok"},
    ]
    r2 = await http.client.chat.completions.create(
        model="tiny",
        messages=convo,  # type: ignore[arg-type]
        extra_headers={"X-Session-Id": "h1"},
    )
    ids = (r2.model_extra or {})["prompt_token_ids"]
    assert ids[: len(kept)] == kept
    assert (r2.model_extra or {})["rollmesh"]["reused_prefix_tokens"] == len(kept)
    naive = naive_prompt_ids(FakeTokenizer(), tuple(Message(m["role"], str(m["content"])) for m in convo), ())
    assert ids != naive


@pytest.mark.parametrize(
    "unimplemented",
    [
        {"response_format": {"type": "json_object"}},
        {"frequency_penalty": 0.5},
        {"presence_penalty": -1},
        {"logit_bias": {"12": 5}},
        {"top_logprobs": 3, "logprobs": True},
        {"tool_choice": "required"},
    ],
)
async def test_a_parameter_the_gateway_does_not_implement_is_refused_not_ignored(
    http: Http, unimplemented: dict[str, object]
) -> None:
    messages = [{"role": "user", "content": "hello"}]
    with pytest.raises(openai.BadRequestError) as bad:
        await http.client.chat.completions.create(model="tiny", messages=messages, **unimplemented)  # type: ignore[call-overload]
    name = next(iter(unimplemented))
    assert bad.value.param == name and "is not supported by this gateway" in bad.value.message
    # The values clients send by default still work.
    defaults = {"frequency_penalty": 0, "presence_penalty": 0.0, "top_logprobs": 0, "tool_choice": "auto"}
    r = await http.client.chat.completions.create(
        model="tiny",
        messages=messages,
        response_format={"type": "text"},
        logit_bias={},
        **defaults,  # type: ignore[call-overload]
    )
    assert r.choices[0].message.content == "hello"


@pytest.mark.parametrize(
    ("unimplemented", "param"),
    [
        ({"text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"tool_choice": "required", "tools": [{"type": "function", "name": "f"}]}, "tool_choice"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
async def test_the_responses_api_refuses_what_it_does_not_implement(
    http: Http, unimplemented: dict[str, object], param: str
) -> None:
    async with httpx.AsyncClient() as raw:
        bad = await raw.post(f"{http.url}/responses", json={"model": "tiny", "input": "hi", **unimplemented})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
        ok = await raw.post(
            f"{http.url}/responses",
            json={
                "model": "tiny",
                "input": "hi",
                "text": {"format": {"type": "text"}},
                "tool_choice": "auto",
            },
        )
        assert ok.status_code == 200 and ok.json()["output"][0]["content"][0]["text"] == "hi", ok.text


async def test_errors_are_openai_style(http: Http) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        await http.client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert nf.value.status_code == 404 and nf.value.code == "MODEL_NOT_FOUND"

    with pytest.raises(openai.BadRequestError) as bad:
        await http.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1
        )
    assert bad.value.code == "INVALID_SAMPLING_PARAMS" and bad.value.param == "sampling.temperature"

    with pytest.raises(openai.BadRequestError) as long:
        await http.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x" * 600}]
        )
    assert long.value.code == "PROMPT_TOO_LONG"

    http.backend.down = True
    async with httpx.AsyncClient() as raw:
        resp = await raw.post(
            f"{http.url}/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
        )
    assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
    assert resp.json()["error"]["code"] == "BACKEND_UNAVAILABLE"


async def test_api_key_is_required_when_set() -> None:
    gateway = Gateway([FakeBackend("tiny")])
    facade = HttpFacade(gateway, port=0, api_key="s3cret")
    await facade.start()
    try:
        wrong = openai.AsyncOpenAI(base_url=facade.base_url, api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as exc:
            await wrong.models.list()
        assert exc.value.code == "UNAUTHENTICATED"
        right = openai.AsyncOpenAI(base_url=facade.base_url, api_key="s3cret", max_retries=0)
        assert [m.id for m in (await right.models.list()).data] == ["tiny"]
        await wrong.close()
        await right.close()
    finally:
        await facade.stop()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stop": 5}, "stop"),  # was a 500 (TypeError in the facade)
        ({"stop": ["ok", 5]}, "stop"),
        ({"seed": "x"}, "seed"),  # was dropped: answered as if unseeded
        ({"top_k": 2.5}, "top_k"),  # was dropped
        ({"temperature": 1e400}, "sampling.temperature"),  # JSON infinity was accepted
    ],
)
async def test_a_sampling_field_of_the_wrong_type_is_a_400_naming_it(
    http: Http, body: dict[str, object], param: str
) -> None:
    async with httpx.AsyncClient(timeout=20) as client:
        resp = await client.post(
            f"{http.url}/chat/completions",
            content=json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body})
            .replace("Infinity", "1e400")
            .encode(),
            headers={"content-type": "application/json"},
        )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["code"] == "INVALID_SAMPLING_PARAMS", error


@pytest.mark.parametrize("route", ["chat/completions", "responses"])
@pytest.mark.parametrize(
    ("body", "said"),
    [
        ('{"model": "tiny", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        (
            '{"model": "tiny", "input": "\\ud800", "messages": [{"role": "user", "content": "\\udfff"}]}',
            "surrogate",
        ),
    ],
)
async def test_a_body_nested_too_deeply_or_with_a_lone_surrogate_is_a_400(
    http: Http, route: str, body: str, said: str
) -> None:
    """Both were 500s: RecursionError out of the body's parse, UnicodeEncodeError writing the answer."""
    async with httpx.AsyncClient(timeout=20) as client:
        resp = await client.post(
            f"{http.url}/{route}", content=body.encode(), headers={"content-type": "application/json"}
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "body" and said in resp.json()["error"]["message"]
        ok = await client.post(
            f"{http.url}/{route}",
            json={"model": "tiny", "input": "hi", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert ok.status_code == 200, ok.text  # the facade stays healthy


@pytest.mark.parametrize("route", ["chat/completions", "responses"])
@pytest.mark.parametrize(
    ("field", "value"),
    [("stream", "false"), ("stream_options", [1]), ("tools", {}), ("logprobs", "yes"), ("ignore_eos", 1)],
)
async def test_a_field_of_another_json_type_is_a_400_naming_it(
    http: Http, route: str, field: str, value: object
) -> None:
    """`"stream": "false"` streamed (a truthy string), `"stream_options": [1]` was a 500, `"tools": {}`
    was ignored: each is now refused by name."""
    body = {"model": "tiny", "input": "hi", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with httpx.AsyncClient(timeout=20) as client:
        resp = await client.post(f"{http.url}/{route}", json={**body, field: value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == field and f"{field} must be " in resp.json()["error"]["message"]


async def test_a_body_over_the_message_limit_is_a_413_without_being_read_whole(
    http: Http, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 150 MB body was read, parsed and tokenized (150 M tokens) before PROMPT_TOO_LONG; gRPC refuses
    a message over ROLLMESH_MAX_MESSAGE_MB at the transport, and the facade now refuses it the same."""
    monkeypatch.setenv("ROLLMESH_MAX_MESSAGE_MB", "1")
    big = {"model": "tiny", "messages": [{"role": "user", "content": "x" * 2_000_000}]}
    async with httpx.AsyncClient(timeout=20) as client:
        resp = await client.post(f"{http.url}/chat/completions", json=big)
        assert resp.status_code == 413, resp.text
        assert resp.json()["error"]["code"] == "MESSAGE_TOO_LARGE" and "1,048,576 bytes" in resp.text
        small = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        assert (await client.post(f"{http.url}/chat/completions", json=small)).status_code == 200
