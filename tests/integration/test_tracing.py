"""One OpenTelemetry trace per rollout (mesh/tracing.py), exported over OTLP/gRPC to a receiver in
the test: a scheduler calls a real gateway and verifier over gRPC, every rollout is traced
(always_on), and a two-turn tool rollout yields one trace whose spans cover scheduler -> gateway ->
replica and scheduler -> verifier (seed, tool call, verify), with the rollout key, job id, policy
version and outcome on the root span. Tracing unconfigured is off."""

from __future__ import annotations

import asyncio
import collections
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh import tracing
from rollmesh.mesh.errors import DeadlineExceeded
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.conftest import StartServer

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.arrived = asyncio.Event()

    async def Export(self, request: Any, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest_asyncio.fixture
async def receiver(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[_Receiver]:
    """An OTLP receiver, and tracing configured to send to it with the sampler `request.param`
    (default: always_on)."""
    sampler, ratio = getattr(request, "param", ("always_on", "1"))
    got = _Receiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(got, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    for name, value in {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_TRACES_SAMPLER": sampler,
        "OTEL_TRACES_SAMPLER_ARG": ratio,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }.items():
        monkeypatch.setenv(name, value)
    assert tracing.configure("test")
    try:
        yield got
    finally:
        await asyncio.to_thread(tracing.shutdown)
        await server.stop(grace=0)


def _tool_then_answer(prompt: str, request: Any) -> str:
    if "<|tool|>" in prompt:  # the tool answered: say the value
        return "3"
    return '<tool_call>{"name": "increment_counter", "arguments": {"count": 3}}</tool_call>'


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None
    return out


async def _tool_job(
    start_server: StartServer,
    tmp_path: Path,
    repeats: int,
    script: Any = _tool_then_answer,
    retry: RetryPolicy | None = None,
    state: str = "SUCCEEDED",
) -> str:
    """A job of `repeats` two-turn tool rollouts through a real gateway and verifier over gRPC;
    returns its id once it ended in `state` and every span was sent."""
    gateway = Gateway([FakeBackend("fake", script=script)])
    await gateway.start()
    verifier = VerifierService.from_catalog(VerifierConfig(), CATALOG)
    await verifier.start()
    gw = await start_server([ServiceBinding.of(GatewayServicer(gateway))])
    vf = await start_server([ServiceBinding.of(VerifierServicer(verifier))])
    model, env = GatewayModel.connect(gw.address), VerifierEnv.connect(vf.address)
    mgr = JobManager(CATALOG, model=model, env=env, output_dir=str(tmp_path))
    try:
        example = BUILTIN_ROOT / "environments" / "session_state" / "data" / "example.jsonl"
        dataset = tmp_path / "one.jsonl"
        dataset.write_text(example.read_text().splitlines()[0] + "\n")  # starts at 0, add 3
        spec = JobSpec(
            dataset=str(dataset),
            environment="session_state",
            num_repeats=repeats,
            output_dir=str(tmp_path),
            retry=retry or RetryPolicy(),
        )
        rec = await mgr.wait((await mgr.submit(spec)).job_id)
        assert rec.state == state, rec.error
    finally:
        await mgr.aclose()
        await model.close()
        await env.close()
        await verifier.aclose()
        await gateway.shutdown()
    await asyncio.to_thread(tracing.shutdown)  # flushes every span to the receiver
    return rec.job_id


async def test_a_tool_rollout_is_one_trace_across_the_services(
    receiver: _Receiver, start_server: StartServer, tmp_path: Path
) -> None:
    job_id = await _tool_job(start_server, tmp_path, repeats=1)

    (root,) = [s for s in receiver.spans if s.name == "rollout"]
    trace = [s for s in receiver.spans if s.trace_id == root.trace_id]
    assert not root.parent_span_id
    attrs = _attrs(root)
    assert attrs["rollmesh.rollout_key"] == "0:0" and attrs["rollmesh.job_id"] == job_id
    assert attrs["rollmesh.outcome"] == "succeeded" and attrs["rollmesh.reward"] == 1.0
    assert attrs["rollmesh.policy_version"] == "0"

    by_id = {s.span_id: s for s in trace}

    def chain(span: Any) -> list[str]:
        names = [span.name]
        while span.parent_span_id:
            span = by_id[span.parent_span_id]
            names.append(span.name)
        return names

    def named(name: str) -> list[Any]:  # (at least once: a loaded machine may retry an attempt)
        found = [s for s in trace if s.name == name]
        assert found, (name, [s.name for s in trace])
        return found

    assert len(named("model_turn")) >= 2 and len(named("gateway.replica")) >= 2
    for s in named("gateway.replica"):
        assert chain(s) == ["gateway.replica", "gateway.generate", "model_turn", "attempt", "rollout"]
        assert _attrs(s)["rollmesh.replica_id"]
    for s in named("verifier.verify"):
        assert chain(s) == ["verifier.verify", "verify", "attempt", "rollout"]
    for s in named("rollmesh.v1.EnvironmentVerifier/CallTool"):
        assert chain(s) == ["rollmesh.v1.EnvironmentVerifier/CallTool", "tool_call", "attempt", "rollout"]
    for s in named("rollmesh.v1.EnvironmentVerifier/SeedSession"):
        assert chain(s)[1:] == ["seed_session", "attempt", "rollout"]
    assert {s.trace_id for s in receiver.spans if s.name in ("model_turn", "tool_call")} == {root.trace_id}
    assert max(_attrs(s)["rollmesh.attempt"] for s in named("attempt")) == attrs["rollmesh.attempts"]

    # Semantic conventions: rpc.* on every call's spans, gen_ai.* on the model's, the tool named.
    for s in [*named("model_turn"), *named("gateway.generate")]:
        a = _attrs(s)
        assert a["rpc.system"] == "grpc" and a["rpc.service"] == "rollmesh.v1.ModelGateway"
        assert a["rpc.method"] == "Generate" and a["rpc.grpc.status_code"] == 0
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert [v.string_value for v in a["gen_ai.response.finish_reasons"].values] in (
            ["stop"],
            ["tool_calls"],
        )
    assert _attrs(named("gateway.generate")[0])["gen_ai.response.model"] == "fake"
    for s in named("tool_call"):
        a = _attrs(s)
        assert a["gen_ai.tool.name"] == "increment_counter" and a["gen_ai.tool.call.id"]
        assert a["rpc.method"] == "CallTool" and a["rpc.grpc.status_code"] == 0
    for s in named("rollmesh.v1.EnvironmentVerifier/CallTool"):
        a = _attrs(s)
        assert (a["rpc.service"], a["rpc.method"], a["rpc.grpc.status_code"]) == (
            "rollmesh.v1.EnvironmentVerifier",
            "CallTool",
            0,
        )
    for s in [*named("verify"), *named("verifier.verify")]:
        assert _attrs(s)["rpc.method"] == "Verify" and _attrs(s)["rpc.grpc.status_code"] == 0
    assert _attrs(named("verifier.verify")[0])["rollmesh.reward"] == 1.0
    assert root.status.code == root.status.STATUS_CODE_UNSET


def _always_late(prompt: str, request: Any) -> str:
    raise DeadlineExceeded("the model took too long")  # retryable


async def test_a_failed_rollout_is_an_error_trace_with_each_attempt_numbered(
    receiver: _Receiver, start_server: StartServer, tmp_path: Path
) -> None:
    """A failed rollout's root span was UNSET, and its retried attempts flat siblings."""
    retry = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)
    await _tool_job(start_server, tmp_path, 1, script=_always_late, retry=retry, state="FAILED")
    (root,) = [s for s in receiver.spans if s.name == "rollout"]
    assert root.status.code == root.status.STATUS_CODE_ERROR
    assert root.status.message.startswith("DEADLINE_EXCEEDED")
    attrs = _attrs(root)
    assert attrs["rollmesh.outcome"] == "failed" and attrs["rollmesh.attempts"] == 3
    attempts = sorted(
        (s for s in receiver.spans if s.name == "attempt"), key=lambda s: s.start_time_unix_nano
    )
    assert [_attrs(s)["rollmesh.attempt"] for s in attempts] == [1, 2, 3]
    assert all(s.parent_span_id == root.span_id for s in attempts)
    assert all(s.status.code == s.status.STATUS_CODE_ERROR for s in attempts)
    turns = [s for s in receiver.spans if s.name == "model_turn"]
    assert len(turns) == 3 and {s.parent_span_id for s in turns} == {s.span_id for s in attempts}
    assert all(_attrs(s)["rpc.grpc.status_code"] == 4 for s in turns)  # DEADLINE_EXCEEDED


@pytest.mark.parametrize("receiver", [("parentbased_traceidratio", "0.5")], indirect=True)
async def test_sampling_keeps_whole_rollout_traces_and_makes_no_others(
    receiver: _Receiver, start_server: StartServer, tmp_path: Path
) -> None:
    await _tool_job(start_server, tmp_path, repeats=24)
    roots = {s.trace_id for s in receiver.spans if s.name == "rollout"}
    assert 0 < len(roots) < 24  # about half the rollouts (all or none: 2 in 2**24)
    assert {s.trace_id for s in receiver.spans} == roots  # no span outside a sampled rollout's trace
    names_of: dict[bytes, list[str]] = collections.defaultdict(list)
    for s in receiver.spans:
        names_of[s.trace_id].append(s.name)
    whole = {"rollout", "model_turn", "gateway.generate", "gateway.replica", "tool_call", "verify"}
    for names in names_of.values():  # every sampled rollout's trace whole, with one root
        assert names.count("rollout") == 1 and whole <= set(names) and "verifier.verify" in names


@pytest.mark.parametrize("receiver", [("parentbased_traceidratio", "0.25")], indirect=True)
async def test_a_new_traces_decision_is_the_samplers_rule_and_only_sampled_calls_carry_context(
    receiver: _Receiver,
) -> None:
    """`new_trace` compares 64 random bits with the sampler's bound instead of asking the SDK's
    sampler each time: the same decision the SDK's ratio sampler makes on those bits as a trace id.
    Outside a sampled trace a unary call gets no metadata (so the callee does no trace work)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON
    from opentelemetry.sdk.trace.sampling import Decision
    from opentelemetry.sdk.trace.sampling import ParentBased
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    sdk = TraceIdRatioBased(0.25)
    ours, theirs = [], []
    for seed in range(2000):
        random.seed(seed)
        ours.append(tracing.new_trace())
        random.seed(seed)
        theirs.append(
            sdk.should_sample(None, random.getrandbits(64), "rollout").decision == Decision.RECORD_AND_SAMPLE
        )
    assert ours == theirs and 400 < sum(ours) < 600
    assert tracing._bound_of(ParentBased(ALWAYS_OFF)) == 0 and tracing._bound_of(ALWAYS_ON) == 1 << 64

    assert tracing.metadata() is None and tracing.inject() == {}
    with tracing.trace("rollout") as root:
        assert root is not None
        ((key, value),) = tracing.metadata() or ()
        assert key == "traceparent" and tracing.sampled({key: value})
    assert tracing.metadata() is None


def test_tracing_is_off_unless_the_otel_variables_ask() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_TRACES_EXPORTER": "none"}
    )
    assert not tracing.enabled() and tracing.inject() == {} and tracing.metadata() is None
    assert not tracing.new_trace()
    with tracing.span("nothing") as s:
        assert s is None


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_ray_serve_replica_continues_the_gateways_trace_in_its_own_process(
    receiver: _Receiver,
) -> None:
    """Both engine paths of a real Ray Serve deployment (fake-engine replica: the production serving
    path minus vLLM): a session's streamed call and a micro-batched whole output each give a
    `replica.generate` span, sent by the replica process, child of the gateway's span."""
    from rollmesh.gateway import GenerateInput
    from rollmesh.gateway import Message
    from rollmesh.gateway import SamplingInput
    from rollmesh.serving.backend import RayServeBackend
    from tests.serving_replicas import tiny_serving_config

    config = tiny_serving_config(engine="fake", replicas=1, replica_cpus=0.1, startup_timeout_s=600)
    backend = RayServeBackend(config)
    gateway = Gateway([backend])
    await gateway.start()
    try:
        for session in ("s1", ""):
            with tracing.span("test", root=True):
                inp = GenerateInput(
                    messages=(Message("user", "What is 1 + 1?"),),
                    sampling=SamplingInput(temperature=0.0, max_tokens=8),
                    session_id=session,
                )
                await gateway.generate(inp)
        names = ("replica.generate", "gateway.replica")
        async with asyncio.timeout(120):  # spans leave in batches (every 100 ms here)
            while min(len([s for s in receiver.spans if s.name == n]) for n in names) < 2:
                receiver.arrived.clear()
                await receiver.arrived.wait()
    finally:
        await gateway.shutdown()
    by_id = {s.span_id: s for s in receiver.spans}
    replica_spans = [s for s in receiver.spans if s.name == "replica.generate"]
    assert len(replica_spans) == 2
    for s in replica_spans:
        parent = by_id[s.parent_span_id]
        assert parent.name == "gateway.replica" and parent.trace_id == s.trace_id
        assert _attrs(s)["rollmesh.replica"] == _attrs(parent)["rollmesh.replica_id"]
    assert sorted(_attrs(s)["rollmesh.batched"] for s in replica_spans) == [False, True]
