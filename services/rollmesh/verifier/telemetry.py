"""The verifier's Prometheus metrics (mesh/metrics.py serves them): verifies and tool calls by
environment and outcome, verify time, and code sandbox runs by result; read at scrape time off the
live verifier (it registers its `live_state`, which returns a `VerifierNow`): open sessions, and per
environment whether it can serve, its bridged server's restarts (a counter: `_total`) and its worker
queue (waiting and running checks).

Labels are bounded: a loaded environment's name, an outcome (`ok`, or the error's reason, a fixed
set per package), a sandbox result. Never a session id.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import Counter
from prometheus_client import Histogram

from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.metrics import LATENCY_BUCKETS
from rollmesh.mesh.metrics import LiveCollector
from rollmesh.mesh.metrics import Sample

VERIFIES = Counter(
    "rollmesh_verifier_verifies",
    "Verifies finished, by environment and outcome: ok, or the error's reason (VERIFY_TIMEOUT, ...).",
    ["environment", "outcome"],
)
VERIFY_SECONDS = Histogram(
    "rollmesh_verifier_verify_seconds", "Time one verify took.", ["environment"], buckets=LATENCY_BUCKETS
)
TOOL_CALLS = Counter(
    "rollmesh_verifier_tool_calls",
    "Tool calls finished, by environment and outcome: ok, or the error's reason (TOOL_NOT_FOUND, ...).",
    ["environment", "outcome"],
)
SANDBOX_RUNS = Counter(
    "rollmesh_verifier_sandbox_runs",
    "Code sandbox runs, by result: ok (every case has a verdict), timeout, crashed, or unavailable (the"
    " sandbox never came up: no verdict).",
    ["result"],
)
for _result in ("ok", "timeout", "crashed", "unavailable"):  # each at 0 before its first run
    SANDBOX_RUNS.labels(_result)
#: Outcomes any environment's verifies and tool calls can have, each at 0 from the environment's
#: start (`at_zero`); an environment's own reasons appear when they first happen.
VERIFY_OUTCOMES = ("ok", "internal", "VERIFY_TIMEOUT", "BAD_TASK")
TOOL_OUTCOMES = ("ok", "internal", "TOOL_NOT_FOUND")


def at_zero(environment: str) -> None:
    """The environment's verify and tool-call counters and its verify-time histogram, at 0: a rule
    over them sees 0 before the first call, not an absent series."""
    for result in VERIFY_OUTCOMES:
        VERIFIES.labels(environment, result)
    for result in TOOL_OUTCOMES:
        TOOL_CALLS.labels(environment, result)
    VERIFY_SECONDS.labels(environment)


def outcome(exc: BaseException | None) -> str:
    """`ok`, a domain error's reason, or `internal`."""
    if exc is None:
        return "ok"
    return exc.reason if isinstance(exc, RollmeshError) else "internal"


_LIVE_DOCS = {
    "rollmesh_verifier_sessions_open": "Environment sessions open now.",
    "rollmesh_verifier_environment_up": "1 while an environment can serve; 0 while it cannot (failed to"
    " load, or the server it bridges to is down: ListEnvironments lists it broken).",
    "rollmesh_verifier_environment_server_restarts": "Restarts of the server an environment bridges to"
    " (a managed NeMo Gym or verifiers server) since the verifier started it (a counter).",
    "rollmesh_verifier_worker_calls_waiting": "Checks waiting for a free worker process now (the queue"
    " depth).",
    "rollmesh_verifier_worker_calls_running": "Checks running in a worker process now.",
}


@dataclass(frozen=True, slots=True)
class EnvironmentNow:
    """One loaded environment as a scrape reads it."""

    name: str
    up: bool  # it can serve (no `problem()`)
    server_restarts: int
    calls_waiting: int
    calls_running: int


@dataclass(frozen=True, slots=True)
class VerifierNow:
    sessions_open: int
    loaded: tuple[EnvironmentNow, ...]
    broken: tuple[str, ...]  # the names of those that failed to load


def samples(now: VerifierNow) -> Iterator[Sample]:
    yield "rollmesh_verifier_sessions_open", {}, float(now.sessions_open)
    for item in now.loaded:
        env = {"environment": item.name}
        yield "rollmesh_verifier_environment_up", env, 1.0 if item.up else 0.0
        yield "rollmesh_verifier_environment_server_restarts", env, float(item.server_restarts)
        yield "rollmesh_verifier_worker_calls_waiting", env, float(item.calls_waiting)
        yield "rollmesh_verifier_worker_calls_running", env, float(item.calls_running)
    for name in now.broken:
        yield "rollmesh_verifier_environment_up", {"environment": name}, 0.0


LIVE = LiveCollector(
    samples, _LIVE_DOCS, counters=frozenset({"rollmesh_verifier_environment_server_restarts"})
)
