"""The rollout scheduler: jobs of rollouts streamed to sinks with backpressure."""

from rollmesh.scheduler.manager import JobManager, JobRecord
from rollmesh.scheduler.spec import JobSpec, RetryPolicy, SinkConfig

__all__ = ["JobManager", "JobRecord", "JobSpec", "RetryPolicy", "SinkConfig"]
