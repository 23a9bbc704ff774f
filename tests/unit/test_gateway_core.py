"""The Gateway domain object over FakeBackends: routing, accounting, errors, cancel/abort,
pause/resume, policy versions, tool calls and token-exact sessions."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from rollmesh.gateway import Gateway
from rollmesh.gateway import GatewayConfig
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import Message
from rollmesh.gateway import SamplingInput
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.gateway.config import ModelSpec
from rollmesh.gateway.sessions import naive_prompt_ids
from rollmesh.gateway.types import GenerateResult
from rollmesh.gateway.types import StreamDelta
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.errors import RollmeshError

USER = (Message("user", "what is 5+7?"),)


async def started(*backends: FakeBackend, **kw: Any) -> Gateway:
    gw = Gateway(list(backends), **kw)
    await gw.start()
    return gw


def inp(**kw: Any) -> GenerateInput:
    kw.setdefault("messages", USER)
    return GenerateInput(**kw)


async def test_generate_returns_ids_logprobs_usage_replica_and_model() -> None:
    gw = await started(FakeBackend("m"))
    r = await gw.generate(inp(sampling=SamplingInput(logprobs=True), request_id="req-1"))
    tok = FakeTokenizer()
    assert r.message == Message("assistant", "what is 5+7?")
    assert tok.decode(r.prompt_token_ids) == "<|bos|><|user|>\nwhat is 5+7?<|end|>\n<|assistant|>\n"
    assert r.output_token_ids[-1] == tok.eos_token_id
    assert len(r.logprobs) == len(r.output_token_ids)
    assert r.usage.prompt_tokens == len(r.prompt_token_ids)
    assert r.usage.completion_tokens == len(r.output_token_ids)
    assert (r.finish_reason, r.replica_id, r.model, r.request_id) == ("stop", "m-replica-0", "m", "req-1")


async def test_stream_yields_deltas_then_the_result() -> None:
    gw = await started(FakeBackend("m", script=lambda p, r: "abc"))
    items = [x async for x in gw.generate_stream(inp())]
    deltas = [x for x in items if isinstance(x, StreamDelta)]
    assert "".join(d.text for d in deltas) == "abc"
    assert isinstance(items[-1], GenerateResult) and items[-1].message.content == "abc"
    assert gw.running_requests() == []


async def test_models_route_by_name_and_default() -> None:
    a, b = FakeBackend("a", script=lambda p, r: "from a"), FakeBackend("b", script=lambda p, r: "from b")
    gw = await started(a, b, config=GatewayConfig(default_model="b"))
    assert (await gw.generate(inp())).message.content == "from b"
    assert (await gw.generate(inp(model="a"))).message.content == "from a"
    listed = {m.name: m for m in await gw.list_models()}
    assert listed["b"].is_default and not listed["a"].is_default


async def test_list_models_counts_in_flight_and_sessions_per_replica() -> None:
    fb = FakeBackend("m", num_replicas=2, token_latency_s=60)
    gw = await started(fb)
    replica = fb.pick_replica("s1")
    stream = gw.generate_stream(inp(session_id="s1", request_id="r1"))
    first = await anext(stream)  # one token produced; the rest waits on token latency
    assert isinstance(first, StreamDelta)
    (m,) = await gw.list_models()
    by_id = {r.replica_id: r for r in m.replicas}
    assert set(by_id) == set(fb.replica_ids)
    assert by_id[replica].in_flight == 1
    assert sum(r.in_flight for r in m.replicas) == 1
    await stream.aclose()  # the caller went away: the engine request is aborted
    assert fb.aborted == ["r1"]
    (m,) = await gw.list_models()
    assert sum(r.in_flight for r in m.replicas) == 0

    fb.token_latency_s = 0
    r = await gw.generate(inp(session_id="s1"))
    assert r.replica_id == replica  # session affinity
    (m,) = await gw.list_models()
    assert {x.replica_id: x.sessions for x in m.replicas}[replica] == 1


def _err(exc: pytest.ExceptionInfo[RollmeshError]) -> tuple[grpc.StatusCode, str]:
    return exc.value.code, exc.value.reason


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        (SamplingInput(temperature=-0.1), "sampling.temperature"),
        (SamplingInput(top_p=0.0), "sampling.top_p"),
        (SamplingInput(top_p=1.5), "sampling.top_p"),
        (SamplingInput(max_tokens=0), "sampling.max_tokens"),
        (SamplingInput(max_tokens=-3), "sampling.max_tokens"),
        (SamplingInput(max_tokens=100_000), "sampling.max_tokens"),
        (SamplingInput(top_k=-2), "sampling.top_k"),
    ],
)
async def test_invalid_sampling_is_invalid_argument_naming_the_field(
    sampling: SamplingInput, field: str
) -> None:
    gw = await started(FakeBackend("m", max_model_len=512))
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(inp(sampling=sampling))
    assert _err(exc) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SAMPLING_PARAMS")
    assert exc.value.metadata["field"] == field
    assert field in exc.value.message


async def test_unknown_model_is_not_found() -> None:
    gw = await started(FakeBackend("m"))
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(inp(model="nope"))
    assert _err(exc) == (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND")
    assert "nope" in exc.value.message


async def test_prompt_longer_than_context_is_resource_exhausted() -> None:
    fb = FakeBackend("m", max_model_len=16)
    gw = await started(fb)
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(inp(messages=(Message("user", "x" * 40),)))
    assert _err(exc) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "PROMPT_TOO_LONG")
    assert exc.value.retry_after_s is None  # retrying cannot help
    assert list(fb.requests) == []


async def test_max_tokens_is_clamped_to_the_context_left() -> None:
    fb = FakeBackend("m", max_model_len=32, script=lambda p, r: "y" * 100)
    gw = await started(fb)
    r = await gw.generate(inp(messages=(Message("user", "hi"),), sampling=SamplingInput(max_tokens=30)))
    assert r.finish_reason == "length"
    assert len(r.prompt_token_ids) + len(r.output_token_ids) == 32


async def test_backend_down_is_unavailable_with_retry_info() -> None:
    fb = FakeBackend("m")
    fb.down, fb.retry_after_s = True, 2.5
    gw = await started(fb)
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(inp())
    assert _err(exc) == (grpc.StatusCode.UNAVAILABLE, "BACKEND_UNAVAILABLE")
    assert exc.value.retry_after_s == 2.5


async def test_bad_request_shapes() -> None:
    gw = await started(FakeBackend("m"))
    cases: list[tuple[GenerateInput, grpc.StatusCode, str]] = [
        (GenerateInput(), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GENERATE_REQUEST"),
        (inp(prompt_token_ids=(1, 2)), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GENERATE_REQUEST"),
        (
            inp(tools=(ToolSpec("t", "", "{not json"),)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_GENERATE_REQUEST",
        ),
        # ids outside the tokenizer's were INTERNAL (the engine's error); an empty role rendered no turn
        (
            GenerateInput(prompt_token_ids=(1, -1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_GENERATE_REQUEST",
        ),
        (
            GenerateInput(prompt_token_ids=(99_999_999,)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_GENERATE_REQUEST",
        ),
        (inp(messages=(Message(" ", "hi"),)), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GENERATE_REQUEST"),
        (  # was RecursionError out of json.loads: INTERNAL
            inp(tools=(ToolSpec("t", "", "[" * 100_000 + "]" * 100_000),)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "INVALID_GENERATE_REQUEST",
        ),
    ]
    for bad, code, reason in cases:
        with pytest.raises(RollmeshError) as exc:
            await gw.generate(bad)
        assert _err(exc) == (code, reason)


async def test_duplicate_running_request_id_is_already_exists() -> None:
    fb = FakeBackend("m", token_latency_s=60)
    gw = await started(fb)
    task = asyncio.create_task(gw.generate(inp(request_id="same")))
    await fb.wait_running("same")
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(inp(request_id="same"))
    assert _err(exc) == (grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_IN_USE")
    assert await gw.abort("same")
    assert (await task).finish_reason == "abort"


async def test_deadline_aborts_the_engine_request() -> None:
    fb = FakeBackend("m", token_latency_s=60)
    gw = await started(fb)
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(inp(request_id="slow"), timeout_s=0.2)
    assert _err(exc) == (grpc.StatusCode.DEADLINE_EXCEEDED, "GENERATION_DEADLINE_EXCEEDED")
    assert "slow" in fb.aborted
    assert gw.running_requests() == []


async def test_cancelling_the_caller_aborts_the_backend_request() -> None:
    fb = FakeBackend("m", token_latency_s=60)
    gw = await started(fb)
    task = asyncio.create_task(gw.generate(inp(request_id="c1")))
    await fb.wait_running("c1")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fb.aborted == ["c1"]
    assert gw.running_requests() == []


async def test_abort_ends_the_generation_with_finish_reason_abort() -> None:
    fb = FakeBackend("m", token_latency_s=60)
    gw = await started(fb)
    task = asyncio.create_task(gw.generate(inp(request_id="a1")))
    await fb.wait_running("a1")
    assert await gw.abort("a1") is True
    r = await task
    assert r.finish_reason == "abort"
    assert fb.aborted[0] == "a1"
    assert await gw.abort("a1") is False  # no longer running
    assert await gw.abort("never") is False


async def test_pause_holds_new_generations_until_resume_and_lets_running_ones_finish() -> None:
    fb = FakeBackend("m", token_latency_s=0.01)
    gw = await started(fb)
    running = asyncio.create_task(gw.generate(inp(request_id="running")))
    await fb.wait_running("running")
    gw.pause()
    assert (await running).finish_reason == "stop"  # in flight when paused: finishes

    held = asyncio.create_task(gw.generate(inp(request_id="held")))
    await asyncio.sleep(0)  # let the task run up to its first wait (the pause)
    assert gw.running_requests() == ["held"]
    assert [r.request_id for r in fb.requests] == ["running"]  # never reached the engine
    (m,) = await gw.list_models()
    assert m.paused
    gw.resume()
    assert (await held).finish_reason == "stop"
    assert (await gw.list_models())[0].paused is False


async def test_paused_past_the_deadline_is_deadline_exceeded() -> None:
    fb = FakeBackend("m")
    gw = await started(fb)
    gw.pause("m")
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(inp(), timeout_s=0.05)
    assert _err(exc) == (grpc.StatusCode.DEADLINE_EXCEEDED, "GENERATION_PAUSED")
    assert list(fb.requests) == []


async def test_abort_releases_a_request_held_by_pause() -> None:
    gw = await started(FakeBackend("m"))
    gw.pause()
    task = asyncio.create_task(gw.generate(inp(request_id="h")))
    await asyncio.sleep(0)
    assert await gw.abort("h")
    assert (await task).finish_reason == "abort"


async def test_policy_version_labels_every_response() -> None:
    gw = await started(FakeBackend("a"), FakeBackend("b"))
    assert (await gw.generate(inp())).policy_version == "0"
    assert gw.set_policy_version("", "v1") == "0"
    assert (await gw.generate(inp(model="b"))).policy_version == "v1"
    assert gw.set_policy_version("a", "v2") == "v1"
    assert (await gw.generate(inp(model="a"))).policy_version == "v2"
    assert {m.name: m.policy_version for m in await gw.list_models()} == {"a": "v2", "b": "v1"}


async def test_tool_calls_are_parsed_with_finish_reason_tool_calls() -> None:
    call = '<tool_call>{"name": "add", "arguments": {"a": 5, "b": 7}}</tool_call>'
    gw = await started(FakeBackend("m", script=lambda p, r: "Adding." + call))
    r = await gw.generate(inp(tools=(ToolSpec("add", "adds", '{"type": "object"}'),)))
    assert r.finish_reason == "tool_calls"
    assert r.message.content == "Adding."
    assert [(c.name, c.arguments_json) for c in r.message.tool_calls] == [("add", '{"a": 5, "b": 7}')]
    assert r.message.tool_calls[0].id.startswith("call_")
    # the prompt carried the tools in the system block
    assert "You can call these tools" in FakeTokenizer().decode(r.prompt_token_ids)


async def test_a_turn_cut_by_length_keeps_length_with_a_whole_tool_call_in_it() -> None:
    """The call closed before max_tokens cut the text: it was labelled "tool_calls", so a cut turn
    looked complete (and the agent ran the call)."""
    said = 'Adding.<tool_call>{"name": "add", "arguments": {"a": 5}}</tool_call>'
    gw = await started(FakeBackend("m", script=lambda p, r: said + " and then more"))
    r = await gw.generate(inp(sampling=SamplingInput(max_tokens=len(FakeTokenizer().encode(said)) + 2)))
    assert r.finish_reason == "length" and [c.name for c in r.message.tool_calls] == ["add"]


async def test_malformed_tool_call_stays_content() -> None:
    bad = '<tool_call>{"name": "add", "arguments": {</tool_call>'
    gw = await started(FakeBackend("m", script=lambda p, r: bad))
    r = await gw.generate(inp())
    assert (r.finish_reason, r.message.content, r.message.tool_calls) == ("stop", bad, ())


def _non_canonical_twelve(prompt: str, request: EngineRequest) -> Sequence[int]:
    return FakeTokenizer.char_ids("12")


async def test_session_turns_are_token_exact_where_naive_retokenization_is_not() -> None:
    fb = FakeBackend("m", script=_non_canonical_twelve)
    gw = await started(fb)
    r1 = await gw.generate(inp(session_id="s"))
    convo = (*USER, r1.message, Message("user", "and 6+6?"))
    r2 = await gw.generate(inp(messages=convo, session_id="s"))
    kept = (*r1.prompt_token_ids, *r1.output_token_ids)
    assert r2.prompt_token_ids[: len(kept)] == kept
    assert r2.reused_prefix_tokens == len(kept)
    naive = naive_prompt_ids(fb.tokenizer, convo, ())
    assert list(r2.prompt_token_ids) != naive
    assert fb.requests[-1].prompt_token_ids == r2.prompt_token_ids  # the engine saw the exact ids

    # Without the session (or after CloseSession) the prompt is a fresh full rendering.
    assert gw.close_session("s") is True and gw.close_session("s") is False
    r3 = await gw.generate(inp(messages=convo, session_id="s"))
    assert r3.reused_prefix_tokens == 0 and list(r3.prompt_token_ids) == naive


async def test_prompt_token_ids_are_used_as_is() -> None:
    fb = FakeBackend("m")
    gw = await started(fb)
    ids = tuple(FakeTokenizer().encode("<|bos|><|user|>\nhey<|end|>\n<|assistant|>\n"))
    r = await gw.generate(GenerateInput(prompt_token_ids=ids))
    assert r.prompt_token_ids == ids and r.message.content == "hey"


class _MessageOnly(FakeBackend):
    supports_token_ids = False


async def test_prompt_token_ids_on_a_message_only_backend_is_failed_precondition() -> None:
    gw = await started(_MessageOnly("remote"))
    with pytest.raises(RollmeshError) as exc:
        await gw.generate(GenerateInput(prompt_token_ids=(1, 2, 3)))
    assert _err(exc) == (grpc.StatusCode.FAILED_PRECONDITION, "TOKEN_IDS_UNSUPPORTED")
    r = await gw.generate(inp())  # messages still work; the backend gets them, not ids
    assert r.finish_reason == "stop"
    assert gw_messages(gw) == [{"role": "user", "content": "what is 5+7?"}]


def gw_messages(gw: Gateway) -> list[dict[str, Any]]:
    (m,) = [x for x in gw._models.values()]
    backend = m.backend
    assert isinstance(backend, FakeBackend)
    return list(backend.requests[-1].messages)


async def test_routes_alias_a_model_or_add_a_url_backend() -> None:
    created: list[ModelSpec] = []

    def factory(spec: ModelSpec) -> FakeBackend:
        created.append(spec)
        return FakeBackend(spec.name, script=lambda p, r: "remote says hi")

    gw = await started(FakeBackend("m"), backend_factory=factory)
    info = await gw.register_route("job-7", target_model="m")
    assert info.name == "job-7" and info.backend == "fake"
    assert (await gw.generate(inp(model="job-7"))).model == "m"
    assert (await gw.register_route("job-7", target_model="m")).name == "job-7"  # idempotent

    url = await gw.register_route(
        "judge", target_model="qwen", base_url="http://127.0.0.1:1/v1", api_key_env="K"
    )
    assert url.name == "judge"
    assert created == [
        ModelSpec(
            name="judge", backend="openai", model="qwen", base_url="http://127.0.0.1:1/v1", api_key_env="K"
        )
    ]
    assert (await gw.generate(inp(model="judge"))).message.content == "remote says hi"
    assert {m.name for m in await gw.list_models()} == {"m", "judge", "job-7"}

    for call, code, reason in [
        (gw.register_route("m", target_model="m"), grpc.StatusCode.ALREADY_EXISTS, "ROUTE_EXISTS"),
        (gw.register_route("x", target_model="nope"), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
        (gw.register_route("bad name", target_model="m"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ROUTE"),
        (gw.register_route("y"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ROUTE"),
        # was UNAVAILABLE (retryable) once the connection to ftp://x failed
        (gw.register_route("z", base_url="ftp://x/v1"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ROUTE"),
    ]:
        with pytest.raises(RollmeshError) as exc:
            await call
        assert _err(exc) == (code, reason)


async def test_shutdown_reaches_every_backend() -> None:
    a, b = FakeBackend("a"), FakeBackend("b")
    gw = await started(a, b)
    assert a.started and b.started
    await gw.shutdown()
    assert not a.started and not b.started


async def test_a_stop_string_ends_the_message_the_ids_keep_what_the_engine_produced() -> None:
    """vLLM ends a request on a stop string with the ids that completed it (measured on tiny-arith:
    stop " " after "The" gives ids decoding to "The answer", text "The"). The gateway decoded the ids
    into the message, so the verifier scored text past the stop string; now the message ends where
    an OpenAI server's would, the ids stay the engine's, and the next turn of the session keeps them."""
    from rollmesh.scheduler.records import Rollout
    from rollmesh.scheduler.records import RolloutKey
    from rollmesh.scheduler.tokens import build_token_record
    from rollmesh.scheduler.tokens import validate_rollout

    tok = FakeTokenizer()
    gw = await started(FakeBackend("m", script=lambda prompt, request: "The answer is 12."))
    stop = SamplingInput(stop=("is 1",), logprobs=True)
    r1 = await gw.generate(inp(sampling=stop, session_id="s"))
    assert (r1.finish_reason, r1.message.content) == ("stop", "The answer ")
    # The engine's ids: the stop string, and the "2" of the id "12" that completed it.
    assert tok.decode(r1.output_token_ids) == "The answer is 12"
    convo = (*USER, r1.message, Message("user", "and 6+6?"))
    r2 = await gw.generate(inp(messages=convo, session_id="s"))
    kept = (*r1.prompt_token_ids, *r1.output_token_ids)
    assert r2.prompt_token_ids[: len(kept)] == kept and r2.message.content == "The answer is 12."
    rollout = Rollout(RolloutKey(0, 0), "j", {}, [r1.message.to_openai(), r2.message.to_openai()], 0.0)
    rollout.tokens = build_token_record([r1, r2])  # a GenerateResult carries a turn's ids
    assert validate_rollout(rollout, tokenizer=tok) == []


async def test_a_slow_fake_model_waits_before_its_first_token_and_is_abortable() -> None:
    from rollmesh.gateway.backends.factory import create_backend

    fb = create_backend(ModelSpec("m", backend="fake"), environ={"ROLLMESH_FAKE_LATENCY_S": "60"})
    assert isinstance(fb, FakeBackend) and fb.first_token_latency_s == 60.0
    gw = await started(fb)
    call = asyncio.create_task(gw.generate(inp(request_id="slow")))
    await fb.wait_running("slow")
    assert not call.done()  # waiting for its first token
    assert await fb.abort("slow")
    result = await asyncio.wait_for(call, 10)
    assert result.finish_reason == "abort" and not result.output_token_ids
