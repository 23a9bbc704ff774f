"""The rollout scheduler: jobs of rollouts streamed to sinks with backpressure."""

from rollmesh.mesh.server import ServiceBinding
from rollmesh.scheduler.manager import JobManager, JobRecord
from rollmesh.scheduler.spec import JobSpec, RetryPolicy, SinkConfig


def binding(manager: JobManager) -> ServiceBinding:
    """The scheduler's servicer, ready for `mesh.build_server`."""
    from rollmesh.scheduler.servicer import SchedulerServicer
    from rollmesh_client.v1 import scheduler_pb2, scheduler_pb2_grpc

    return ServiceBinding.of(
        scheduler_pb2, scheduler_pb2_grpc, "RolloutScheduler", SchedulerServicer(manager)
    )


__all__ = ["JobManager", "JobRecord", "JobSpec", "RetryPolicy", "SinkConfig", "binding"]
