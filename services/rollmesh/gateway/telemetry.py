"""The gateway's Prometheus metrics (mesh/metrics.py serves them): generations by model and finish
reason, their time, time to first token and time held at the pause gate (queueing), tokens in and
out, weight updates; read at scrape time off the live gateways (each registers its `live_models`,
which returns `ModelNow`s): generations in flight per model and per replica, waiting at the pause
gate, held (paused) or not, and the policy version each model serves.

Labels are bounded: a served model or route (at most `max_routes` of them), a finish reason (an
unknown word counted as `other`), a replica id. Never a request or session id.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import Counter
from prometheus_client import Histogram

from rollmesh.mesh.metrics import LATENCY_BUCKETS
from rollmesh.mesh.metrics import LiveCollector
from rollmesh.mesh.metrics import Sample

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "abort", "error", "repetition", "unknown"})

GENERATIONS = Counter(
    "rollmesh_gateway_generations",
    "Generations finished, by model and finish reason (a reason outside the known ones: other).",
    ["model", "finish_reason"],
)
GENERATION_SECONDS = Histogram(
    "rollmesh_gateway_generation_seconds",
    "Time from a generation's arrival to its result (waits while paused for a weight update included).",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
FIRST_TOKEN_SECONDS = Histogram(
    "rollmesh_gateway_time_to_first_token_seconds",
    "Time from a generation's arrival to the engine's first output.",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_SECONDS = Histogram(
    "rollmesh_gateway_queue_seconds",
    "Time from a generation's arrival until it passed the pause gate to the engine (held while paused"
    " for a weight update; about 0 otherwise).",
    ["model"],
    buckets=LATENCY_BUCKETS,
)
TOKENS = Counter(
    "rollmesh_gateway_tokens",
    "Tokens of finished generations: prompt (in) and completion (out).",
    ["model", "kind"],
)
WEIGHT_UPDATE_TOKENS = Counter(
    "rollmesh_gateway_weight_update_tokens",
    "Output ids of generations a weight update interrupted, by fate: discarded (ABORT_AND_RETRY ran"
    " the generation again from its prompt) or resubmitted (CONTINUE went on from them: prefilled"
    " again as prompt on the new weights).",
    ["model", "fate"],
)
WEIGHT_UPDATES = Counter(
    "rollmesh_gateway_weight_updates",
    "UpdateWeights / UploadWeights loads, by model and outcome (ok, failed).",
    ["model", "outcome"],
)


def model_served(model: str) -> None:
    """A model or route now served: its weight-update series exist at 0 before the first update."""
    for outcome in ("ok", "failed"):
        WEIGHT_UPDATES.labels(model, outcome)


def finished(
    model: str, finish_reason: str, prompt_tokens: int, completion_tokens: int, seconds: float
) -> None:
    reason = finish_reason if finish_reason in FINISH_REASONS else "other"
    GENERATIONS.labels(model, reason).inc()
    GENERATION_SECONDS.labels(model).observe(seconds)
    TOKENS.labels(model, "prompt").inc(prompt_tokens)
    TOKENS.labels(model, "completion").inc(completion_tokens)


def _version(label: str) -> float:
    """The policy version as a number (UpdateWeights counts up from an integer); NaN when a caller
    named a version that is not one."""
    try:
        return float(int(label))
    except ValueError:
        return math.nan


_LIVE_DOCS = {
    "rollmesh_gateway_generations_in_flight": "Generations past the pause gate now, by model.",
    "rollmesh_gateway_replica_generations_in_flight": "Generations on each replica now (0 while it has"
    " none: a replica the backend reports keeps its series).",
    "rollmesh_gateway_replica_up": "1 while the backend reports a replica healthy, 0 while it reports it"
    " unhealthy (read every 10 s and at each status call).",
    "rollmesh_gateway_generations_held": "Models holding new generations now (paused, or a weight update).",
    "rollmesh_gateway_generations_waiting": "Generations held at the pause gate now, by model.",
    "rollmesh_gateway_policy_version": "The policy version each model serves (NaN: a non-integer label).",
}


@dataclass(frozen=True, slots=True)
class ModelNow:
    """One served model or route as a scrape reads it."""

    name: str
    generating: int  # past the pause gate
    in_flight: Mapping[str, int]  # by replica (0 for a replica the backend reports with none)
    replica_health: Mapping[str, bool]  # the backend's last word on each replica
    held: bool  # paused, or a weight update
    waiting: int  # at the pause gate
    policy_version: str


def samples(models: Sequence[ModelNow]) -> Iterator[Sample]:
    for m in models:
        yield "rollmesh_gateway_generations_in_flight", {"model": m.name}, float(m.generating)
        for replica, n in m.in_flight.items():
            yield "rollmesh_gateway_replica_generations_in_flight", {"model": m.name, "replica": replica}, n
        for replica, healthy in m.replica_health.items():
            yield (
                "rollmesh_gateway_replica_up",
                {"model": m.name, "replica": replica},
                1.0 if healthy else 0.0,
            )
        yield "rollmesh_gateway_generations_held", {"model": m.name}, 1.0 if m.held else 0.0
        yield "rollmesh_gateway_generations_waiting", {"model": m.name}, float(m.waiting)
        yield "rollmesh_gateway_policy_version", {"model": m.name}, _version(m.policy_version)


LIVE = LiveCollector(samples, _LIVE_DOCS, newest=frozenset({"rollmesh_gateway_policy_version"}))
