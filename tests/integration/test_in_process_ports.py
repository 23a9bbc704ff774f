"""The scheduler's ports on servicers in the same process (the embedded mesh: `in_process`) answer
exactly as the same ports over gRPC do: the same turns and verdicts, the same errors (class, code,
reason, message, metadata, retry delay) for domain errors, unexpected failures, unary calls and
items over the message limit; a deadline or a cancelled caller aborts the engine request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import RollmeshClientError
from tests.conftest import StartServer

TASK = {"responses_create_params": {"input": "What is 2 + 3?"}, "expected_answer": "5"}


@dataclass
class Ports:
    backend: FakeBackend
    gateway: Gateway
    model: dict[str, GatewayModel]
    env: dict[str, VerifierEnv]


@pytest_asyncio.fixture
async def ports(start_server: StartServer) -> AsyncIterator[Ports]:
    backend = FakeBackend("tiny", num_replicas=1, max_model_len=256)
    gateway = Gateway([backend])
    await gateway.start()
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    verifier = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await verifier.start()
    gw_servicer, ver_servicer = GatewayServicer(gateway), VerifierServicer(verifier)
    gw_server = await start_server([ServiceBinding.of(gw_servicer)])
    ver_server = await start_server([ServiceBinding.of(ver_servicer)])
    p = Ports(
        backend,
        gateway,
        model={
            "grpc": GatewayModel.connect(gw_server.address),
            "in_process": GatewayModel.in_process(gw_servicer),
        },
        env={
            "grpc": VerifierEnv.connect(ver_server.address),
            "in_process": VerifierEnv.in_process(ver_servicer),
        },
    )
    try:
        yield p
    finally:
        for port in (*p.model.values(), *p.env.values()):
            await port.close()
        await verifier.aclose()
        await gateway.shutdown()


def _call(request_id: str, *, model: str = "", **sampling: Any) -> GenerateCall:
    return GenerateCall(
        model=model,
        messages=[{"role": "user", "content": "what is 5+7?"}],
        tools=[],
        sampling={"temperature": 0, "logprobs": True, **sampling},
        session_id="",
        request_id=request_id,
    )


def _error(exc: RollmeshClientError) -> tuple[Any, ...]:
    return (type(exc), exc.code, exc.reason, str(exc), exc.metadata, exc.retry_after_s)


async def _both_fail(p: Ports, call: Callable[[str], Awaitable[Any]]) -> tuple[Any, ...]:
    """The error `call(kind)` raises on each kind of port: asserted equal, returned."""
    seen = {}
    for kind in ("grpc", "in_process"):
        with pytest.raises(RollmeshClientError) as info:
            await call(kind)
        seen[kind] = _error(info.value)
    assert seen["in_process"] == seen["grpc"]
    return seen["grpc"]


async def test_same_turns_and_verdicts(ports: Ports) -> None:
    turns = {k: await m.generate(_call(f"same-{k}")) for k, m in ports.model.items()}
    for turn in turns.values():
        turn.latency_s = turn.first_token_s = 0.0  # (times differ run to run)
    assert turns["in_process"] == turns["grpc"] and turns["grpc"].message["content"] == "what is 5+7?"
    answer = [{"role": "assistant", "content": "5"}]
    verdicts = {k: await e.verify("arithmetic", TASK, answer, "") for k, e in ports.env.items()}
    assert verdicts["in_process"] == verdicts["grpc"] and verdicts["grpc"].reward == 1.0
    described = {k: await e.describe_environment("arithmetic") for k, e in ports.env.items()}
    assert described["in_process"] == described["grpc"]
    capacity = {k: await m.engine_capacity("") for k, m in ports.model.items()}
    assert capacity["in_process"] == capacity["grpc"]


async def test_same_errors(ports: Ports) -> None:
    model, env = ports.model, ports.env
    not_found = await _both_fail(ports, lambda k: model[k].generate(_call(f"nf-{k}", model="nope")))
    assert not_found[1:3] == (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND")
    bad = await _both_fail(ports, lambda k: model[k].generate(_call(f"bad-{k}", max_tokens=0)))
    assert bad[1:3] == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SAMPLING_PARAMS")

    ports.backend.down, ports.backend.retry_after_s = True, 2.0
    down = await _both_fail(ports, lambda k: model[k].generate(_call(f"down-{k}")))
    assert down[1] == grpc.StatusCode.UNAVAILABLE and down[5] == 2.0
    ports.backend.down = False

    def crash(prompt: str, request: EngineRequest) -> str:
        raise RuntimeError("a bug in the backend")

    ports.backend.script = crash  # not a domain error: INTERNAL, the exception's type only
    internal = await _both_fail(ports, lambda k: model[k].generate(_call(f"crash-{k}")))
    assert internal[1:3] == (grpc.StatusCode.INTERNAL, "INTERNAL")
    assert "generate failed: RuntimeError" in internal[3] and "a bug" not in internal[3]

    answer = [{"role": "assistant", "content": "5"}]
    unknown = await _both_fail(ports, lambda k: env[k].verify("nope", TASK, answer, ""))
    assert unknown[1] == grpc.StatusCode.NOT_FOUND
    # Unary calls: the interceptor's mapping.
    seeded = await _both_fail(ports, lambda k: env[k].seed_session("nope", TASK, f"s-{k}"))
    assert seeded[1] == grpc.StatusCode.NOT_FOUND
    described = await _both_fail(ports, lambda k: env[k].describe_environment("nope"))
    assert described[1] == grpc.StatusCode.NOT_FOUND
    # An item over the message limit fails alone, before it is sent.
    huge = [{"role": "assistant", "content": "5" * (64 << 20)}]
    too_large = await _both_fail(ports, lambda k: env[k].verify("arithmetic", TASK, huge, ""))
    assert too_large[1:3] == (grpc.StatusCode.INVALID_ARGUMENT, "MESSAGE_TOO_LARGE")


@pytest.mark.parametrize("kind", ["grpc", "in_process"])
async def test_deadline_and_cancel_abort_the_engine_request(ports: Ports, kind: str) -> None:
    ports.backend.token_latency_s = 60
    model = ports.model[kind]
    with pytest.raises(TimeoutError):  # the job's deadline (engine.py) cuts the call
        async with asyncio.timeout(0.5):
            await model.generate(_call(f"late-{kind}"))
    await ports.backend.wait_aborted(f"late-{kind}")
    task = asyncio.create_task(model.generate(_call(f"gone-{kind}")))
    await ports.backend.wait_running(f"gone-{kind}")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await ports.backend.wait_aborted(f"gone-{kind}")
    assert ports.gateway.running_requests() == []


async def test_every_port_answers_the_watchdogs_health_check(ports: Ports) -> None:
    """The in-process port has no channel: its health check raised AttributeError in the watchdog
    (logged each second once a verify ran 30 s), where its service is as alive as the caller."""
    for port in (*ports.model.values(), *ports.env.values()):
        assert await port.responsive(5.0), port


async def test_same_session_round_trip(ports: Ports) -> None:
    """Seed, a tool call, a tool error, verify on the session and close: the unary session calls."""
    task = {"verifier_metadata": {"initial_value": 3}, "expected_answer": "5"}
    seen = {}
    for kind, env in ports.env.items():
        session = "sess"  # the same id on each port, one after the other
        tools = (await env.seed_session("session_state", task, session)).tools
        added = await env.call_tool(
            session, {"id": "c1", "function": {"name": "increment_counter", "arguments": {"count": 2}}}
        )
        refused = await env.call_tool(
            session, {"id": "c2", "function": {"name": "increment_counter", "arguments": {"count": 10**19}}}
        )
        verdict = await env.verify("session_state", task, [{"role": "assistant", "content": ""}], session)
        await env.close_session(session)
        seen[kind] = (tools, added, refused.is_error, verdict)
    assert seen["in_process"] == seen["grpc"]
    assert seen["grpc"][1].output == "5" and seen["grpc"][2] is True and seen["grpc"][3].reward == 1.0
    closed = await _both_fail(ports, lambda k: ports.env[k].call_tool("sess", {"name": "get_counter_value"}))
    assert closed[1] == grpc.StatusCode.NOT_FOUND
