"""The verifier's Prometheus metrics (mesh/metrics.py serves them): verifies and tool calls by
environment and outcome, verify time, and code sandbox runs by result; read at scrape time off the
live verifier: open sessions, and per environment whether it can serve, its bridged server's
restarts and its worker queue (waiting and running checks).

Labels are bounded: a loaded environment's name, an outcome (`ok`, or the error's reason, a fixed
set per package), a sandbox result. Never a session id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Histogram

from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.metrics import LATENCY_BUCKETS, LiveCollector

if TYPE_CHECKING:
    from rollmesh.verifier.service import VerifierService

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
    " (a managed NeMo Gym or verifiers server) since the verifier started it.",
    "rollmesh_verifier_worker_calls_waiting": "Checks waiting for a free worker process now (the queue"
    " depth).",
    "rollmesh_verifier_worker_calls_running": "Checks running in a worker process now.",
}


def _read(service: VerifierService) -> Iterator[tuple[str, dict[str, str], float]]:
    yield "rollmesh_verifier_sessions_open", {}, float(len(service.sessions))
    loaded, broken = service.live_environments()
    for item in loaded:
        env = {"environment": item.name}
        yield "rollmesh_verifier_environment_up", env, 0.0 if item.env.problem() else 1.0
        yield "rollmesh_verifier_environment_server_restarts", env, float(item.env.server_restarts())
        workers = item.env.context.workers
        yield "rollmesh_verifier_worker_calls_waiting", env, float(workers.waiting)
        yield "rollmesh_verifier_worker_calls_running", env, float(workers.busy)
    for name in broken:
        yield "rollmesh_verifier_environment_up", {"environment": name}, 0.0


LIVE = LiveCollector(_read, _LIVE_DOCS)
