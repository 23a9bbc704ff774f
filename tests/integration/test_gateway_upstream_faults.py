"""The openai backend against the project's own fault-injecting OpenAI server (rollmesh.devtools).

Each upstream failure names its cause (ErrorInfo reason + http_status), in unary and streaming calls;
usage comes from the upstream; the connection pool follows the caller's concurrency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import openai
import pytest
import pytest_asyncio

from rollmesh.devtools.openai_server import FaultConfig
from rollmesh.devtools.openai_server import Frequency
from rollmesh.devtools.openai_server import OpenAITestServer
from rollmesh.devtools.openai_server import openai_server_process
from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import Message
from rollmesh.gateway.backends.openai import OpenAIBackend
from rollmesh.gateway.types import GenerateResult
from rollmesh.mesh.errors import RollmeshError

ASK = GenerateInput(messages=(Message("user", "What is 41 + 19?"),))


@pytest_asyncio.fixture
async def server() -> AsyncIterator[OpenAITestServer]:
    async with OpenAITestServer() as s:
        yield s


async def _generate(gw: Gateway, *, stream: bool, inp: GenerateInput = ASK) -> GenerateResult:
    if not stream:
        return await gw.generate(inp, timeout_s=60)
    async for item in gw.generate_stream(inp, timeout_s=60):
        if isinstance(item, GenerateResult):
            return item
    raise AssertionError("no result")


async def test_the_test_server_speaks_openai(server: OpenAITestServer) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)
    try:
        assert [m.id for m in (await client.models.list()).data] == ["tiny"]
        assert (await client.models.retrieve("tiny")).id == "tiny"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("other")
        msgs: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": "What is 2 + 3?"}
        ]
        done = await client.chat.completions.create(model="tiny", messages=msgs)
        assert done.choices[0].message.content == "The answer is 5."
        assert done.usage is not None and (done.usage.prompt_tokens, done.usage.completion_tokens) == (5, 4)
        stream = await client.chat.completions.create(
            model="tiny", messages=msgs, stream=True, stream_options={"include_usage": True}
        )
        parts, usage = [], None
        async for chunk in stream:
            parts += [c.delta.content or "" for c in chunk.choices]
            usage = chunk.usage or usage
        assert "".join(parts) == "The answer is 5." and usage is not None and usage.total_tokens == 9
    finally:
        await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_answers_carry_the_upstream_usage(server: OpenAITestServer, stream: bool) -> None:
    gw = Gateway([OpenAIBackend("tiny", base_url=server.base_url)])
    await gw.start()
    try:
        r = await _generate(gw, stream=stream)
        assert r.message.content == "The answer is 60." and r.finish_reason == "stop"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 4)
        assert bool(server.stats.bodies[-1].get("stream")) is stream
    finally:
        await gw.shutdown()


CASES = [
    # faults, code, reason, http_status
    (
        FaultConfig(fail_statuses=(500,), fail=Frequency(every=1)),
        grpc.StatusCode.UNAVAILABLE,
        "UPSTREAM_HTTP_ERROR",
        "500",
    ),
    (
        FaultConfig(fail_statuses=(502,), fail=Frequency(every=1)),
        grpc.StatusCode.UNAVAILABLE,
        "UPSTREAM_HTTP_ERROR",
        "502",
    ),
    (
        FaultConfig(fail_statuses=(429,), fail=Frequency(every=1), retry_after_s=3),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "UPSTREAM_RATE_LIMITED",
        "429",
    ),
    (
        FaultConfig(fail_statuses=(400,), fail=Frequency(every=1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "UPSTREAM_REJECTED",
        "400",
    ),
    (
        FaultConfig(fail_statuses=(422,), fail=Frequency(every=1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "UPSTREAM_REJECTED",
        "422",
    ),
    (
        FaultConfig(fail_statuses=(401,), fail=Frequency(every=1)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UPSTREAM_AUTH_FAILED",
        "401",
    ),
    (
        FaultConfig(fail_statuses=(403,), fail=Frequency(every=1)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "UPSTREAM_AUTH_FAILED",
        "403",
    ),
    (FaultConfig(drop=Frequency(every=1)), grpc.StatusCode.UNAVAILABLE, "UPSTREAM_STREAM_DROPPED", None),
]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize(("faults", "code", "reason", "http_status"), CASES)
async def test_upstream_failures_name_the_cause(
    server: OpenAITestServer,
    stream: bool,
    faults: FaultConfig,
    code: grpc.StatusCode,
    reason: str,
    http_status: str | None,
) -> None:
    server.set_faults(faults)
    gw = Gateway([OpenAIBackend("tiny", base_url=server.base_url)])
    try:
        with pytest.raises(RollmeshError) as exc:
            await _generate(gw, stream=stream)
        assert (exc.value.code, exc.value.reason) == (code, reason), exc.value.message
        assert exc.value.metadata.get("http_status") == http_status
        if reason == "UPSTREAM_RATE_LIMITED":
            assert exc.value.retry_after_s == 3.0
        if code == grpc.StatusCode.UNAVAILABLE:
            assert exc.value.retry_after_s is not None  # retryable, with RetryInfo
        server.set_faults(FaultConfig())  # the next call goes through: nothing stuck in the pool
        assert (await _generate(gw, stream=stream)).message.content == "The answer is 60."
    finally:
        await gw.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_an_answer_that_names_no_finish_reason_is_unknown_not_stop(
    server: OpenAITestServer, stream: bool
) -> None:
    """finish_reason null (or a stream whose chunks name none before [DONE]) was read as "stop": an
    answer the server may have cut passed for a complete one."""
    server.set_faults(FaultConfig(finish_reason=""))
    gw = Gateway([OpenAIBackend("tiny", base_url=server.base_url)])
    try:
        r = await _generate(gw, stream=stream)
        assert (r.message.content, r.finish_reason) == ("The answer is 60.", "unknown")
    finally:
        await gw.shutdown()


@pytest.mark.parametrize("finish_reason", ["stop", ""], ids=["stop", "null"])
async def test_a_stream_that_ends_without_done_is_dropped_not_an_answer(
    server: OpenAITestServer, finish_reason: str
) -> None:
    """EOF with no `data: [DONE]` is a cut connection, even after a chunk named a finish reason (what
    came after it, the usage, may be what was lost): it was an answer ("stop" without one)."""
    server.set_faults(FaultConfig(send_done=False, finish_reason=finish_reason))
    gw = Gateway([OpenAIBackend("tiny", base_url=server.base_url)])
    try:
        with pytest.raises(RollmeshError) as exc:
            await _generate(gw, stream=True)
        assert exc.value.reason == "UPSTREAM_STREAM_DROPPED" and "without [DONE]" in exc.value.message
        assert exc.value.retry_after_s is not None  # retryable
    finally:
        await gw.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
async def test_a_hung_upstream_is_a_timeout(server: OpenAITestServer, stream: bool) -> None:
    server.set_faults(FaultConfig(hang=Frequency(every=1)))
    gw = Gateway([OpenAIBackend("tiny", base_url=server.base_url, timeout_s=0.5)])
    try:
        with pytest.raises(RollmeshError) as exc:
            await _generate(gw, stream=stream)
        assert (exc.value.code, exc.value.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "UPSTREAM_TIMEOUT")
    finally:
        await gw.shutdown()


async def test_an_unreachable_upstream() -> None:
    gw = Gateway([OpenAIBackend("tiny", base_url="http://127.0.0.1:9/v1")])
    try:
        for stream in (False, True):
            with pytest.raises(RollmeshError) as exc:
                await _generate(gw, stream=stream)
            assert (exc.value.code, exc.value.reason) == (grpc.StatusCode.UNAVAILABLE, "UPSTREAM_UNREACHABLE")
    finally:
        await gw.shutdown()


def test_a_connect_timeout_is_unreachable_not_a_read_timeout() -> None:
    """aiohttp's connect timeout is a TimeoutError too; it must not read as "no answer within 600 s"."""
    backend = OpenAIBackend("tiny", base_url="http://127.0.0.1:9/v1")
    err = backend._transport_error(aiohttp.ConnectionTimeoutError("Connection timeout to host"))
    assert (err.code, err.reason) == (grpc.StatusCode.UNAVAILABLE, "UPSTREAM_UNREACHABLE")
    assert "no connection within 10 s" in err.message
    read = backend._transport_error(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))
    assert (read.code, read.reason) == (grpc.StatusCode.DEADLINE_EXCEEDED, "UPSTREAM_TIMEOUT")


async def test_abort_ends_a_unary_call_waiting_on_the_upstream(server: OpenAITestServer) -> None:
    server.set_faults(FaultConfig(hang=Frequency(every=1)))
    gw = Gateway([OpenAIBackend("tiny", base_url=server.base_url)])
    try:
        inp = GenerateInput(messages=ASK.messages, request_id="r1")
        call = asyncio.create_task(gw.generate(inp, timeout_s=60))
        deadline = time.monotonic() + 30
        while server.stats.in_flight == 0:  # the call reached the upstream
            assert time.monotonic() < deadline and not call.done()
            await asyncio.sleep(0.01)
        assert await gw.abort("r1")
        result = await asyncio.wait_for(call, 30)
        assert result.finish_reason == "abort"
    finally:
        await gw.shutdown()


async def test_2000_concurrent_requests_reach_a_2s_latency_server() -> None:
    """The pool follows the caller's concurrency (no library-default cap of 100 connections). The
    server runs in its own process: in this one, its accept loop would share the client's event loop
    and, on a loaded host, leave connects waiting past the 10 s connect timeout."""
    n = 2000
    server = openai_server_process(FaultConfig(latency_s=2.0))
    base_url, _ = await asyncio.to_thread(server.__enter__)
    try:
        gw = Gateway([OpenAIBackend("tiny", base_url=base_url)])
        try:
            started = time.monotonic()
            results = await asyncio.gather(*(gw.generate(ASK, timeout_s=300) for _ in range(n)))
            elapsed = time.monotonic() - started
        finally:
            await gw.shutdown()
        async with (
            aiohttp.ClientSession() as http,
            http.get(base_url.removesuffix("/v1") + "/_stats") as resp,
        ):
            stats = await resp.json()
    finally:
        await asyncio.to_thread(server.__exit__, None, None, None)
    assert all(r.message.content == "The answer is 60." for r in results)
    assert stats["outcomes"] == {"ok": n}
    # A library-default pool (httpx, aiohttp: 100 connections) caps the peak at 100 and needs 20
    # waves of 2 s (>= 40 s). Here every call gets a connection; on an idle host all 2,000 are in
    # flight at once, on a loaded one the first calls may finish before the last connect.
    assert stats["peak_in_flight"] > 500, stats
    assert elapsed < 120, f"{n} calls to a 2 s server took {elapsed:.1f} s"
    print(f"peak in flight {stats['peak_in_flight']} of {n}, {elapsed:.1f} s")


def test_the_server_runs_as_a_process_with_faults_from_the_command_line() -> None:
    import json
    import urllib.request

    from rollmesh.devtools.openai_server import openai_server_process

    with openai_server_process(FaultConfig(fail_statuses=(503,), fail=Frequency(every=2))) as (url, proc):
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "What is 1 + 1?"}]})
        request = urllib.request.Request(
            f"{url}/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:  # call 1 answers
            assert json.loads(resp.read())["choices"][0]["message"]["content"] == "The answer is 2."
        with pytest.raises(urllib.error.HTTPError) as exc:  # call 2 fails as configured
            urllib.request.urlopen(request, timeout=30)
        assert exc.value.code == 503
        with urllib.request.urlopen(url.removesuffix("/v1") + "/_stats", timeout=30) as resp:
            assert json.loads(resp.read())["outcomes"] == {"ok": 1, "fail_503": 1}
    assert proc.returncode is not None


async def test_a_job_through_an_openai_url_counts_upstream_usage(tmp_path: Path) -> None:
    """The whole mesh (embedded) on the openai backend: every rollout's token record is checked
    (validate_all), the upstream's usage (no token ids) fails none of them and reaches the metrics."""
    from rollmesh.gateway import GatewayConfig
    from rollmesh.gateway import ModelSpec
    from rollmesh.launch import embedded_mesh
    from rollmesh_client import Client
    from rollmesh_client.v1 import scheduler_pb2

    async with OpenAITestServer() as upstream:
        spec = ModelSpec(name="tiny", backend="openai", model="tiny", base_url=upstream.base_url)
        cfg = GatewayConfig(models=(spec,), default_model="tiny", http_port=-1)
        async with embedded_mesh(cfg, output_dir=str(tmp_path / "runs")) as m:
            async with await Client.connect(**m.addresses) as c:
                job = await c.scheduler.submit(
                    scheduler_pb2.JobSpec(
                        benchmark="arithmetic",
                        limit=8,
                        num_repeats=2,
                        validate_all=True,
                        output_dir=str(tmp_path),
                    )
                )
                final = await job.result(poll_s=0.1, timeout_s=120)
                metrics = await job.metrics()
    assert (final.progress.done, final.progress.failed) == (16, 0), final.error
    assert metrics.mean_reward == 1.0  # the test server answers sums right
    assert metrics.mean_completion_tokens == 4.0  # "The answer is N." as the upstream counted it
