"""The scheduler's Prometheus metrics (mesh/metrics.py serves them): rollouts done by outcome and
failed by error class, retries, sink writes (and how long a write waited: the sink's backpressure)
and a trainer's acknowledgements; read at scrape time off the live JobManagers (each registers its
`live_jobs`, which returns `JobNow`s): jobs by state, rollouts in flight, the concurrency limit, and
what running jobs wait on.

Labels are bounded: an outcome, an error class (a status reason), a sink kind, a job state, a
service. Never a job id or a rollout key (a job's own numbers are in its metrics.json).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from rollmesh.mesh.metrics import LATENCY_BUCKETS, LiveCollector, Sample

ROLLOUTS_DONE = Counter(
    "rollmesh_scheduler_rollouts_done",
    "Rollouts finished: succeeded (written to the sink) or failed (after every retry).",
    ["outcome"],
)
ROLLOUTS_FAILED = Counter(
    "rollmesh_scheduler_rollouts_failed",
    "Rollouts failed after every retry, by error class (the failures sidecar's `error`).",
    ["error_class"],
)
RETRIES = Counter("rollmesh_scheduler_rollout_retries", "Rollout attempts retried.")
SINK_WRITES = Counter(
    "rollmesh_scheduler_sink_writes",
    "Rows written to a job's sink, by sink kind and row kind.",
    ["sink", "row"],
)
SINK_WRITE_SECONDS = Histogram(
    "rollmesh_scheduler_sink_write_seconds",
    "Time one rollout's sink write took, waits for a full window included (the sink's backpressure).",
    ["sink"],
    buckets=LATENCY_BUCKETS,
)
SINK_ACKS = Counter(
    "rollmesh_scheduler_sink_acks",
    "Rollouts a trainer's RolloutSink acknowledged: consumed, or dropped as stale.",
    ["result"],
)
GROUPS_REFILLED = Counter(
    "rollmesh_scheduler_groups_refilled",
    "Failed groups of jobs that keep batches full (JobSpec.replace_groups): replaced by a fresh group, "
    "or short (the job's bound on replacements used up).",
    ["result"],
)

_SUCCEEDED, _FAILED = ROLLOUTS_DONE.labels("succeeded"), ROLLOUTS_DONE.labels("failed")


def rollout_succeeded() -> None:
    _SUCCEEDED.inc()


def rollout_failed(error_class: str) -> None:
    _FAILED.inc()
    ROLLOUTS_FAILED.labels(error_class).inc()


def sink_kind(sink: object) -> str:
    """`jsonl`, `grpc` or the class name of another sink (a bounded set: the sink classes)."""
    name = type(sink).__name__
    return {"JsonlSink": "jsonl", "GrpcSink": "grpc"}.get(name, name)


_LIVE_DOCS = {
    "rollmesh_scheduler_jobs": "Jobs this scheduler holds in memory, by state.",
    "rollmesh_scheduler_rollouts_in_flight": "Rollouts running now, over every job.",
    "rollmesh_scheduler_concurrency_limit": "Rollouts allowed in flight now, summed over running jobs.",
    "rollmesh_scheduler_jobs_waiting": "Running jobs waiting on a service counted down, or on their sink.",
}


@dataclass(frozen=True, slots=True)
class JobNow:
    """One job held in memory as a scrape reads it; `running` is False for a job not yet running or
    finished (then the other fields are not read)."""

    state: str
    running: bool = False
    in_flight: int = 0
    limit: int = 0
    waiting_on: tuple[str, ...] = ()  # services counted down, and `sink` while its sink waits


def samples(jobs: Sequence[JobNow]) -> Iterator[Sample]:
    for job in jobs:
        yield "rollmesh_scheduler_jobs", {"state": job.state}, 1.0
        if not job.running:
            continue
        yield "rollmesh_scheduler_rollouts_in_flight", {}, float(job.in_flight)
        yield "rollmesh_scheduler_concurrency_limit", {}, float(job.limit)
        for on in job.waiting_on:
            yield "rollmesh_scheduler_jobs_waiting", {"on": on}, 1.0


LIVE = LiveCollector(samples, _LIVE_DOCS)
