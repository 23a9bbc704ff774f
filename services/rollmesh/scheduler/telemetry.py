"""The scheduler's Prometheus metrics (mesh/metrics.py serves them): rollouts done by outcome and
failed by error class, retries, sink writes (and how long a write waited: the sink's backpressure)
and a trainer's acknowledgements; read at scrape time off the live JobManagers (each registers its
`live_jobs`, which returns `JobNow`s): jobs by state, rollouts in flight, the concurrency limit, and
what running jobs wait on.

Labels are bounded: an outcome, an error class (a status reason), a sink kind, a job state, a
service. Never a job id or a rollout key (a job's own numbers are in its metrics.json). Every series
of a known label set exists from the start at 0 (a counter before its first failure, a gauge with no
job in that state), so a rate or an alert reads 0, not "no data".
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from rollmesh.mesh.metrics import LATENCY_BUCKETS, LiveCollector, Sample
from rollmesh.scheduler import errors
from rollmesh_client.v1 import scheduler_pb2

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

SINK_KINDS = ("jsonl", "grpc")
#: The failure classes pre-created at 0: the generic ones and the scheduler's own rollout errors. A
#: class another service names (VERIFY_TIMEOUT, UPSTREAM_HTTP_ERROR:503 ...) gets its series when it
#: first happens (the set is open: a status reason).
ERROR_CLASSES = (
    "INTERNAL",
    "DEADLINE_EXCEEDED",
    "UNAVAILABLE",
    *(
        cls.reason
        for cls in (
            errors.ModelCallDeadline,
            errors.GatewayUnresponsive,
            errors.VerifierUnresponsive,
            errors.GenerationAborted,
            errors.BadReward,
            errors.TokenRecordMismatch,
            errors.RolloutTooLarge,
            errors.GroupMemberFailed,
            errors.GroupReplaced,
            errors.ReplacementsExhausted,
            errors.AgentProgramExited,
            errors.AgentProgramTimedOut,
            errors.AgentServerFailed,
            errors.AgentServerDied,
        )
    ),
)
JOB_STATES = tuple(
    name.removeprefix("JOB_STATE_")
    for name in scheduler_pb2.JobState.keys()
    if name != "JOB_STATE_UNSPECIFIED"
)
WAITING_ON = ("gateway", "verifier", "sink")


def _precreate() -> None:
    """Every series of a bounded label set at 0 before its first sample."""
    for error_class in ERROR_CLASSES:
        ROLLOUTS_FAILED.labels(error_class)
    for kind in SINK_KINDS:
        SINK_WRITE_SECONDS.labels(kind)
        for row in ("rollout", "failure"):
            SINK_WRITES.labels(kind, row)
    for result in ("consumed", "stale"):
        SINK_ACKS.labels(result)
    for result in ("replaced", "short"):
        GROUPS_REFILLED.labels(result)


_precreate()


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
    "rollmesh_scheduler_jobs_waiting": "Running jobs waiting on a service counted down, or on their sink"
    " (label `service`: gateway, verifier, sink).",
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
    """Every state, every service waited on and the totals, at 0 when no job has them."""
    states = dict.fromkeys(JOB_STATES, 0)
    waiting = dict.fromkeys(WAITING_ON, 0)
    in_flight = limit = 0
    for job in jobs:
        states[job.state] = states.get(job.state, 0) + 1
        if not job.running:
            continue
        in_flight += job.in_flight
        limit += job.limit
        for service in job.waiting_on:
            waiting[service] = waiting.get(service, 0) + 1
    for state, n in states.items():
        yield "rollmesh_scheduler_jobs", {"state": state}, float(n)
    yield "rollmesh_scheduler_rollouts_in_flight", {}, float(in_flight)
    yield "rollmesh_scheduler_concurrency_limit", {}, float(limit)
    for service, n in waiting.items():
        yield "rollmesh_scheduler_jobs_waiting", {"service": service}, float(n)


LIVE = LiveCollector(samples, _LIVE_DOCS)
