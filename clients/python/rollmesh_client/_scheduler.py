"""Typed client for the RolloutScheduler: submit a job, then follow it through a handle.

job = await c.scheduler.submit(spec)            # a scheduler_pb2.JobSpec
async for item in job.rollouts(follow=True): ...
final = await job.result()                       # waits until the job ends
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from rollmesh_client._base import ServiceClient
from rollmesh_client._base import UnavailableRetry
from rollmesh_client._errors import UnavailableError
from rollmesh_client.v1 import scheduler_pb2 as pb
from rollmesh_client.v1 import scheduler_pb2_grpc as pb_grpc

FINAL_STATES = frozenset(
    {
        pb.JOB_STATE_SUCCEEDED,
        pb.JOB_STATE_COMPLETED_WITH_FAILURES,
        pb.JOB_STATE_FAILED,
        pb.JOB_STATE_CANCELLED,
        pb.JOB_STATE_INTERRUPTED,
    }
)


def state_name(state: int) -> str:
    return str(pb.JobState.Name(state)).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


class JobHandle:
    """A submitted job: `.get()`, `.result()`, `.cancel()`, `.rollouts()`, `.metrics()`."""

    def __init__(self, client: SchedulerClient, job: pb.Job) -> None:
        self.client = client
        self.job_id = job.job_id
        self.last = job

    async def get(self) -> pb.Job:
        self.last = await self.client.get(self.job_id)
        return self.last

    async def result(self, *, poll_s: float = 0.5, timeout_s: float | None = None) -> pb.Job:
        """Poll until the job ends; returns the final Job (check `.state` and `.error`)."""
        async with asyncio.timeout(timeout_s):
            while True:
                job = await self.get()
                if job.state in FINAL_STATES:
                    return job
                await asyncio.sleep(poll_s)

    async def cancel(self) -> pb.Job:
        self.last = await self.client.cancel(self.job_id)
        return self.last

    def rollouts(
        self, *, offset: int = 0, follow: bool = True, include_failures: bool = False
    ) -> AsyncIterator[pb.StreamRolloutsResponse]:
        return self.client.stream(
            self.job_id, offset=offset, follow=follow, include_failures=include_failures
        )

    async def metrics(self) -> pb.JobMetrics:
        return await self.client.metrics(self.job_id)


class SchedulerClient(ServiceClient):
    """`SubmitJob`, `GetJob`, `ListJobs` (paged for you), `CancelJob`, `StreamRollouts`, `GetJobMetrics`."""

    stub_class = pb_grpc.RolloutSchedulerStub

    async def submit(self, spec: pb.JobSpec, *, request_id: str = "") -> JobHandle:
        """Submit `spec`. Without a `request_id` one is made, so a submit retried after UNAVAILABLE
        (the scheduler restarting) finds the job it may already have started instead of a second."""
        req = pb.SubmitJobRequest(spec=spec, request_id=request_id or f"sdk-{uuid.uuid4().hex}")
        job = await self._unary(self.stub.SubmitJob, req, idempotent=True)
        return JobHandle(self, job)

    def handle(self, job_id: str) -> JobHandle:
        return JobHandle(self, pb.Job(job_id=job_id))

    async def get(self, job_id: str) -> pb.Job:
        return await self._unary(self.stub.GetJob, pb.GetJobRequest(job_id=job_id), idempotent=True)

    async def cancel(self, job_id: str) -> pb.Job:
        return await self._unary(self.stub.CancelJob, pb.CancelJobRequest(job_id=job_id))

    async def jobs(self, *, page_size: int = 100) -> AsyncIterator[pb.Job]:
        async for job in self._pages(
            self.stub.ListJobs, lambda t: pb.ListJobsRequest(page_size=page_size, page_token=t), "jobs"
        ):
            yield job

    async def stream(
        self, job_id: str, *, offset: int = 0, follow: bool = True, include_failures: bool = False
    ) -> AsyncIterator[pb.StreamRolloutsResponse]:
        """The job's rollouts from `offset`. A stream broken by UNAVAILABLE (the scheduler restarted)
        is reopened after the last offset received, within the retry budget: nothing twice."""
        next_offset = offset
        retry = UnavailableRetry(self.unavailable_budget())
        while True:
            req = pb.StreamRolloutsRequest(
                job_id=job_id, offset=next_offset, follow=follow, include_failures=include_failures
            )
            try:
                async for item in self._stream(self.stub.StreamRollouts, req):
                    next_offset = item.offset + 1
                    self._reached = True
                    retry = UnavailableRetry(self.unavailable_budget())  # progress: a fresh budget
                    yield item
                return
            except UnavailableError:
                if not await retry.wait():
                    raise

    async def metrics(self, job_id: str) -> pb.JobMetrics:
        return await self._unary(
            self.stub.GetJobMetrics, pb.GetJobMetricsRequest(job_id=job_id), idempotent=True
        )
