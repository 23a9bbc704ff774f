"""The SDK rides through a service restart where repeating a call cannot duplicate work: reads
(Get, List, metrics) retry UNAVAILABLE within a budget, also on a channel that sat in reconnect
backoff while the server was down; a submit carries a request id so its retry finds the same job;
StreamRollouts resumes after the last offset received. Calls that do work (Verify, Generate) are
never retried by the SDK."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2

from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh_client import Client
from rollmesh_client import UnavailableError
from rollmesh_client._verifier import VerifierClient
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2
from rollmesh_client.v1 import scheduler_pb2_grpc
from tests.conftest import StartServer
from tests.fakes import FakeVerifier
from tests.fakes import _abort


async def test_a_read_reaches_a_restarted_server_through_reconnect_backoff() -> None:
    fake = FakeVerifier()
    server = await build_server([fake.binding()], "127.0.0.1:0")
    await server.start()
    await wait_serving(server.address, timeout_s=30)
    port = server.port
    restarted = None
    async with await Client.connect(verifier=server.address) as c:
        c.retry_unavailable_s = 30
        try:
            assert (await c.verifier.get("arithmetic")).name == "arithmetic"
            await server.stop(grace=0)
            # Calls fail fast while the server is down: the channel backs off between reconnects.
            no_retry = VerifierClient(c.channel("verifier"), retry_unavailable_s=0)
            down_until = time.monotonic() + 4.0
            while time.monotonic() < down_until:
                with pytest.raises(UnavailableError):
                    await no_retry.get("arithmetic")
                await asyncio.sleep(0.1)
            restarted = await build_server([FakeVerifier().binding()], f"127.0.0.1:{port}")
            await restarted.start()
            await wait_serving(restarted.address, timeout_s=30)  # its own channel
            started = time.monotonic()
            assert (await c.verifier.get("arithmetic")).name == "arithmetic"
            assert time.monotonic() - started < 10.0
        finally:
            if restarted is not None:
                await restarted.stop(grace=0)


async def test_reads_retry_unavailable_and_work_is_never_repeated(start_server: StartServer) -> None:
    fake = FakeVerifier()
    server = await start_server([fake.binding()])
    async with await Client.connect(verifier=server.address) as c:
        c.retry_unavailable_s = 30
        assert (await c.verifier.get("arithmetic")).name == "arithmetic"
        fake.faults.fail("GetEnvironment", grpc.StatusCode.UNAVAILABLE, times=2)
        assert (await c.verifier.get("arithmetic")).name == "arithmetic"
        assert fake.faults.calls["GetEnvironment"] == 4
        fake.faults.fail("Verify", grpc.StatusCode.UNAVAILABLE, times=1)
        task = {"expected_answer": "2"}
        with pytest.raises(UnavailableError):
            await c.verifier.verify("arithmetic", task, "2")
        assert fake.faults.calls["Verify"] == 1
    async with await Client.connect(verifier=server.address) as c:
        c.retry_unavailable_s = 0
        assert (await c.verifier.get("arithmetic")).name == "arithmetic"
        fake.faults.fail("GetEnvironment", grpc.StatusCode.UNAVAILABLE, times=1)
        with pytest.raises(UnavailableError):
            await c.verifier.get("arithmetic")


async def test_a_service_never_reached_fails_at_once() -> None:
    """Nothing listens: a read says so at once instead of retrying (what a CLI command against a
    mesh that is not running needs)."""
    async with await Client.connect(registry="127.0.0.1:1") as c:
        c.retry_unavailable_s = 60
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            await c.registry.roots()
        assert time.monotonic() - started < 20.0


class FlakyScheduler(scheduler_pb2_grpc.RolloutSchedulerServicer):
    """The second SubmitJob fails UNAVAILABLE once; StreamRollouts serves offsets 0..total-1, its first stream
    broken by UNAVAILABLE after `break_after` items."""

    def __init__(self, total: int, break_after: int) -> None:
        self.total, self.break_after = total, break_after
        self.request_ids: list[str] = []
        self.stream_offsets: list[int] = []

    def binding(self) -> ServiceBinding:
        return ServiceBinding.of(self)

    async def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest, context: Any) -> scheduler_pb2.Job:
        self.request_ids.append(request.request_id)
        if len(self.request_ids) == 2:
            await _abort(context, code_pb2.UNAVAILABLE, "UNAVAILABLE", "restarting")
        return scheduler_pb2.Job(job_id="job-1", spec=request.spec)

    async def StreamRollouts(  # type: ignore[override]
        self, request: scheduler_pb2.StreamRolloutsRequest, context: Any
    ) -> AsyncIterator[scheduler_pb2.StreamRolloutsResponse]:
        self.stream_offsets.append(int(request.offset))
        for offset in range(int(request.offset), self.total):
            if len(self.stream_offsets) == 1 and offset == self.break_after:
                await _abort(context, code_pb2.UNAVAILABLE, "UNAVAILABLE", "scheduler restarting")
            rollout = scheduler_pb2.Rollout(key=common_pb2.RolloutKey(task_index=offset), reward=1.0)
            yield scheduler_pb2.StreamRolloutsResponse(offset=offset, rollout=rollout)


async def test_submit_is_retried_with_one_request_id_and_the_stream_resumes_by_offset(
    start_server: StartServer,
) -> None:
    fake = FlakyScheduler(total=10, break_after=4)
    server = await start_server([fake.binding()])
    async with await Client.connect(scheduler=server.address) as c:
        c.retry_unavailable_s = 30
        await c.scheduler.submit(scheduler_pb2.JobSpec(benchmark="arithmetic"))
        job = await c.scheduler.submit(scheduler_pb2.JobSpec(benchmark="arithmetic"))
        assert job.job_id == "job-1"
        first, retried, again = fake.request_ids
        assert retried == again != "" and first not in ("", retried)
        offsets = [item.offset async for item in job.rollouts(follow=False)]
    assert offsets == list(range(10))
    assert fake.stream_offsets == [0, 4]
