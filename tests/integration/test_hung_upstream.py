"""Hung model calls through the real gateway (#12.5): the project's OpenAI test server never answers
2% of calls; the scheduler's adaptive deadline cuts them (the gateway aborts the upstream request)
and retries, so the job finishes in seconds with nothing failed, not after the 300 s attempt timeout."""

from __future__ import annotations

import time

from rollmesh.devtools.openai_server import FaultConfig
from rollmesh.devtools.openai_server import Frequency
from rollmesh_client import Client
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.integration.test_failure_classes import TASKS
from tests.integration.test_failure_classes import Stack
from tests.integration.test_failure_classes import stack  # noqa: F401 (fixture)


async def test_hung_upstream_calls_are_cut_and_retried(stack: Stack) -> None:  # noqa: F811
    stack.upstream.set_faults(FaultConfig(latency_s=0.02, hang=Frequency(every=50)))
    spec = pb.JobSpec(
        dataset=str(stack.data),
        environment="arithmetic",
        num_repeats=4,  # 200 rollouts: 4 hung calls
        concurrency=8,
        output_dir=str(stack.out),
        retry=pb.RetryPolicy(attempt_deadline_floor_s=0.5),  # rollout_timeout_s stays 300 s
    )
    t0 = time.monotonic()
    async with await Client.connect(scheduler=stack.scheduler) as c:
        job = await c.scheduler.submit(spec)
        final = await job.result(poll_s=0.1, timeout_s=240)
    elapsed = time.monotonic() - t0
    assert final.state == pb.JOB_STATE_SUCCEEDED, final.error
    assert final.progress.succeeded == 4 * TASKS and final.progress.failed == 0
    assert final.progress.retries >= 3 and final.progress.model_calls_cut >= 3  # cut and tried again
    assert elapsed < 120, f"the job took {elapsed:.0f} s: hung calls held their slots"
    assert stack.upstream.stats.outcomes["hang"] >= 3
