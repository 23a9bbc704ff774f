"""The scheduler's Prometheus metrics (mesh/metrics.py serves them): rollouts done by outcome and
failed by error class, retries, its own calls to the gateway and the verifier (by method and code,
with their time as the scheduler sees it: `CallRecorder`), sink writes (and how long a write
waited: the sink's backpressure) and a trainer's acknowledgements; read at scrape time off the live
JobManagers (each registers its `live_jobs`, which returns `JobNow`s): jobs by state, rollouts in
flight, the concurrency limit, and what running jobs wait on.

Labels are bounded: an outcome, an error class (a status reason), a sink kind, a job state, a
service. Never a job id or a rollout key (a job's own numbers are in its metrics.json). Every series
of a known label set exists from the start at 0 (a counter before its first failure, a gauge with no
job in that state), so a rate or an alert reads 0, not "no data".
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from prometheus_client import REGISTRY
from prometheus_client import Counter
from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rollmesh.mesh.metrics import LATENCY_BUCKETS
from rollmesh.mesh.metrics import LiveCollector
from rollmesh.mesh.metrics import Sample
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

#: The codes a call's failure series exist for at 0 (another code gets its series when it happens).
CALL_FAILURE_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "CANCELLED")
_CALLS_DOC = (
    "The scheduler's calls to the gateway and the verifier as it sees them, by service, method and"
    " status code (a Generate or Verify over the job's multiplexed stream counts as one call)."
)
_CALL_SECONDS_DOC = (
    "Time one of the scheduler's calls took, from the call to its answer or error (the network, the"
    " stream and the service's queue included)."
)
_BOUNDS = tuple(float(b) for b in LATENCY_BUCKETS)
_LE = [*(repr(b) for b in _BOUNDS), "+Inf"]  # as prometheus-client writes them: 0.0001, 1.0, +Inf


def code_of(exc: BaseException) -> str:
    """A failed call's status code name: the SDK's or a domain error's code, CANCELLED for a call the
    scheduler cancelled, DEADLINE_EXCEEDED for a timeout, UNKNOWN for anything else."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    code = getattr(exc, "code", None)
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "DEADLINE_EXCEEDED" if isinstance(exc, TimeoutError) else "UNKNOWN"


class CallRecorder:
    """The call metrics of one service and method (`rollmesh_scheduler_calls_total`,
    `rollmesh_scheduler_call_seconds`), kept as plain numbers the scrape reads (`_CallCollector`):
    a call costs a bisect and three additions, no lock (prometheus-client's Counter and Histogram
    take a lock per update: ~4 us a call here, 2% of a rollout's scheduler CPU). Written from one
    event loop's thread; a scrape, on the endpoint's thread, reads a copy."""

    __slots__ = ("buckets", "codes", "method", "service", "sum")

    def __init__(self, service: str, method: str) -> None:
        self.service, self.method = service, method
        self.codes = dict.fromkeys(("OK", *CALL_FAILURE_CODES), 0)
        self.buckets = [0] * (len(_BOUNDS) + 1)  # per bound, not cumulative; the last: +Inf
        self.sum = 0.0
        _CALL_COLLECTOR.recorders.append(self)

    def answered(self, start: float) -> None:
        """The call that began at `start` (time.perf_counter()) answered."""
        seconds = time.perf_counter() - start
        self.codes["OK"] += 1
        self.buckets[bisect.bisect_left(_BOUNDS, seconds)] += 1
        self.sum += seconds

    def failed(self, exc: BaseException, start: float) -> None:
        """The call that began at `start` ended with `exc` (its code: a bounded set)."""
        seconds = time.perf_counter() - start
        code = code_of(exc)
        self.codes[code] = self.codes.get(code, 0) + 1
        self.buckets[bisect.bisect_left(_BOUNDS, seconds)] += 1
        self.sum += seconds


class _CallCollector(Collector):
    """Every CallRecorder's numbers as a counter and a histogram family, at scrape time."""

    def __init__(self) -> None:
        self.recorders: list[CallRecorder] = []  # one per (service, method): bounded
        REGISTRY.register(self)

    def describe(self) -> list[Metric]:
        return [
            CounterMetricFamily("rollmesh_scheduler_calls", _CALLS_DOC),
            HistogramMetricFamily("rollmesh_scheduler_call_seconds", _CALL_SECONDS_DOC),
        ]

    def collect(self) -> Iterator[Metric]:
        calls = CounterMetricFamily(
            "rollmesh_scheduler_calls", _CALLS_DOC, labels=["service", "method", "code"]
        )
        seconds = HistogramMetricFamily(
            "rollmesh_scheduler_call_seconds", _CALL_SECONDS_DOC, labels=["service", "method"]
        )
        for r in list(self.recorders):
            for code, n in list(r.codes.items()):
                calls.add_metric([r.service, r.method, code], n)
            cumulative = itertools.accumulate(list(r.buckets))
            seconds.add_metric([r.service, r.method], list(zip(_LE, cumulative, strict=True)), r.sum)
        yield calls
        yield seconds


_CALL_COLLECTOR = _CallCollector()


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
