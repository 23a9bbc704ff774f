"""The scheduler's Verify calls share one VerifyBatch stream (scheduler/remote.py `VerifyStream`):
results reach the right caller, per-item errors keep their code and reason, a deadline ends only
its own call, and a broken stream fails its waiting calls as UNAVAILABLE and is reopened."""

from __future__ import annotations

import asyncio
import gc
import json

import grpc
import pytest

from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.scheduler.convert import message_to_pb
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh_client import DeadlineExceededError
from rollmesh_client import InternalError
from rollmesh_client import UnavailableError
from rollmesh_client import verify_mux
from rollmesh_client.v1 import verifier_pb2
from tests.conftest import StartServer
from tests.fakes import FakeVerifier


def _task(i: int) -> dict[str, object]:
    return {"responses_create_params": {"input": f"{i} + 1?"}, "expected_answer": str(i + 1)}


def _answer(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _request(i: int, text: str) -> verifier_pb2.VerifyRequest:
    return verifier_pb2.VerifyRequest(
        environment="arithmetic",
        task_json=json.dumps(_task(i)),
        response=verifier_pb2.ModelResponse(messages=[message_to_pb(m) for m in _answer(text)]),
    )


async def test_concurrent_calls_get_their_own_results_over_one_stream(start_server: StartServer) -> None:
    fake = FakeVerifier()
    server = await start_server([fake.binding()])
    env = VerifierEnv.connect(server.address)
    try:
        answers = [str(i + 1) if i % 3 else "wrong" for i in range(200)]
        verdicts = await asyncio.gather(
            *(env.verify("arithmetic", _task(i), _answer(a), "") for i, a in enumerate(answers))
        )
        assert [v.reward for v in verdicts] == [0.0 if a == "wrong" else 1.0 for a in answers]
        assert [v.extracted_answer for v in verdicts] == answers
        assert verdicts[5].details == {"expected": "6"}
        assert fake.faults.calls["Verify"] == 200
    finally:
        await env.close()


async def test_an_item_error_keeps_its_code_and_the_stream_goes_on(start_server: StartServer) -> None:
    fake = FakeVerifier()
    server = await start_server([fake.binding()])
    env = VerifierEnv.connect(server.address)
    try:
        fake.faults.fail("Verify", grpc.StatusCode.INTERNAL, times=1, message="verify crashed")
        with pytest.raises(InternalError) as info:
            await env.verify("arithmetic", _task(1), _answer("2"), "")
        assert info.value.reason == "INTERNAL" and "verify crashed" in str(info.value)
        fake.faults.fail("Verify", grpc.StatusCode.UNAVAILABLE, times=1, retry_after_s=0.5)
        with pytest.raises(UnavailableError) as unavailable:
            await env.verify("arithmetic", _task(1), _answer("2"), "")
        assert unavailable.value.retry_after_s == pytest.approx(0.5)
        assert (await env.verify("arithmetic", _task(1), _answer("2"), "")).reward == 1.0
    finally:
        await env.close()


async def test_a_deadline_ends_only_its_own_call(start_server: StartServer) -> None:
    """The SDK's per-call deadline (`Multiplexed.call(payload, deadline_s)`; the scheduler's ports give
    none of their own, the job bounds them) ends that call alone."""
    fake = FakeVerifier()
    server = await start_server([fake.binding()])
    env = VerifierEnv.connect(server.address)
    mux = verify_mux(env.stub)
    try:
        fake.faults.delay("Verify", 5.0, times=1)
        slow = asyncio.create_task(mux.call(_request(1, "2"), 0.3))
        while fake.faults.calls.get("Verify", 0) < 1:  # noqa: ASYNC110 (the server counts it)
            await asyncio.sleep(0.01)
        fast = await mux.call(_request(2, "3"), None)
        assert fast.reward == 1.0
        with pytest.raises(DeadlineExceededError):
            await slow
    finally:
        await mux.close()
        await env.close()


async def _verifier_that_dies_mid_call() -> tuple[VerifierEnv, int]:
    """A VerifierEnv whose verifier was stopped while a call waited on it (that call got
    UNAVAILABLE), and the port it listened on."""
    fake = FakeVerifier()
    server = await build_server([fake.binding()], "127.0.0.1:0")
    await server.start()
    await wait_serving(server.address, timeout_s=30)
    env = VerifierEnv.connect(server.address)
    try:
        assert (await env.verify("arithmetic", _task(1), _answer("2"), "")).reward == 1.0
        fake.faults.delay("Verify", 30.0, times=-1)
        waiting = asyncio.create_task(env.verify("arithmetic", _task(1), _answer("2"), ""))
        while fake.faults.calls.get("Verify", 0) < 2:  # noqa: ASYNC110 (the server counts it)
            await asyncio.sleep(0.01)
        await server.stop(grace=0)
        with pytest.raises(UnavailableError):
            await waiting
    except BaseException:
        await env.close()
        raise
    return env, server.port


async def test_a_broken_stream_fails_waiting_calls_as_unavailable_and_reopens() -> None:
    env, port = await _verifier_that_dies_mid_call()
    restarted = None
    try:
        again = FakeVerifier()
        restarted = await build_server([again.binding()], f"127.0.0.1:{port}")
        await restarted.start()
        await wait_serving(restarted.address, timeout_s=30)
        verdict = await env.verify("arithmetic", _task(4), _answer("5"), "")
        assert verdict.reward == 1.0 and json.dumps(verdict.details) == '{"expected": "5"}'
        assert again.faults.calls["Verify"] == 1
    finally:
        await env.close()
        if restarted is not None:
            await restarted.stop(grace=0)


async def test_a_peer_that_dies_leaves_no_request_writer_behind() -> None:
    """The verifier dying mid-call ends grpc.aio's request-writer task too: nothing is left pending
    to be collected later as "Task was destroyed but it is pending" / "aclose(): asynchronous
    generator is already running" (what the scheduler logged when a verifier died mid-job)."""
    loop_errors: list[str] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(str(ctx.get("message"))))
    try:
        env, _ = await _verifier_that_dies_mid_call()
        try:

            def writers() -> list[asyncio.Task[object]]:
                return [t for t in asyncio.all_tasks() if "consume_request_iterator" in repr(t.get_coro())]

            async with asyncio.timeout(30):
                while writers():  # noqa: ASYNC110 (grpc.aio's own task, nothing to wait on)
                    await asyncio.sleep(0.01)
        finally:
            await env.close()
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert loop_errors == []
