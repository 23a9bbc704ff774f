"""The verifier's Prometheus metrics (mesh/metrics.py serves them): verifies and tool calls by
environment and outcome, verify time, and code sandbox runs by result; read at scrape time off the
live verifier: open sessions.

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


_LIVE_DOCS = {"rollmesh_verifier_sessions_open": "Environment sessions open now."}


def _read(service: VerifierService) -> Iterator[tuple[str, dict[str, str], float]]:
    yield "rollmesh_verifier_sessions_open", {}, float(len(service.sessions))


LIVE = LiveCollector(_read, _LIVE_DOCS)
