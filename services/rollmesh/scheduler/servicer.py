"""The RolloutScheduler grpc.aio servicer: proto in, JobManager call, proto out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from rollmesh.mesh.paging import page
from rollmesh.scheduler import convert
from rollmesh.scheduler import job_convert
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.records import Rollout
from rollmesh_client.v1 import scheduler_pb2 as pb
from rollmesh_client.v1 import scheduler_pb2_grpc as pb_grpc


class SchedulerServicer(pb_grpc.RolloutSchedulerServicer):
    def __init__(self, manager: JobManager, *, clock: Any = time.monotonic) -> None:
        self._jobs = manager
        self._clock = clock

    async def SubmitJob(self, request: pb.SubmitJobRequest, context: Any) -> pb.Job:
        rec = await self._jobs.submit(job_convert.spec_from_pb(request.spec), request.request_id)
        return job_convert.job_to_pb(rec, self._clock())

    async def GetJob(self, request: pb.GetJobRequest, context: Any) -> pb.Job:
        return job_convert.job_to_pb(await self._jobs.get(request.job_id), self._clock())

    async def ListJobs(self, request: pb.ListJobsRequest, context: Any) -> pb.ListJobsResponse:
        items, token = page(await self._jobs.list_jobs(), request.page_size, request.page_token)
        now = self._clock()
        return pb.ListJobsResponse(jobs=job_convert.jobs_to_pb(items, now), next_page_token=token)

    async def CancelJob(self, request: pb.CancelJobRequest, context: Any) -> pb.Job:
        return job_convert.job_to_pb(await self._jobs.cancel(request.job_id), self._clock())

    async def StreamRollouts(
        self, request: pb.StreamRolloutsRequest, context: Any
    ) -> AsyncIterator[pb.StreamRolloutsResponse]:
        # Each yield awaits the write, so a slow reader slows this loop (pull-based, bounded).
        async for offset, item in self._jobs.stream(
            request.job_id,
            offset=int(request.offset),
            follow=request.follow,
            include_failures=request.include_failures,
        ):
            if isinstance(item, Rollout):
                yield pb.StreamRolloutsResponse(offset=offset, rollout=convert.rollout_to_pb(item))
            else:
                yield pb.StreamRolloutsResponse(offset=offset, failure=convert.failure_to_pb(item))

    async def GetJobMetrics(self, request: pb.GetJobMetricsRequest, context: Any) -> pb.JobMetrics:
        try:
            msg = convert.metrics_to_pb(await self._jobs.metrics(request.job_id))
        except (TypeError, ValueError, AttributeError, OverflowError):  # metrics.json edited or corrupt
            msg = convert.metrics_to_pb(await self._jobs.metrics(request.job_id, from_file=False))
        msg.job_id = request.job_id
        return msg
