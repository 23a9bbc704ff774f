"""`rollmesh config`: every ROLLMESH_* variable with its default and meaning (from mesh/config.py),
and the per-job retry and timeout defaults (from scheduler/spec.py's RetryPolicy, and the gRPC
sink's ack timeout) with the flag of `rollmesh run` / `jobs submit` that overrides each for one job."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import typer

from rollmesh.commands._common import JsonOut, print_json, print_table

# RetryPolicy field -> (flag overriding it per job, or "" when only the API sets it; meaning).
JOB_DEFAULTS = {
    "max_attempts": ("--max-attempts", "Attempts per rollout before it is recorded as a failure."),
    "initial_backoff_s": ("", "First wait between attempts (doubles each time, with jitter)."),
    "max_backoff_s": ("", "Longest wait between attempts."),
    "rollout_timeout_s": (
        "--rollout-timeout",
        "Most one attempt may take (the adaptive deadline's ceiling).",
    ),
    "unavailable_budget_s": (
        "--unavailable-budget",
        "Seconds the gateway or verifier may stay unreachable before the job fails.",
    ),
    "fail_fast_after": (
        "--fail-fast-after",
        "The same non-retryable error on this many rollouts in a row fails the job.",
    ),
    "attempt_deadline_multiplier": ("", "A model call's deadline: this multiple of the recent p99 latency."),
    "attempt_deadline_floor_s": ("", "The least a model call is given once latency has been observed."),
    "fixed_attempt_deadline": ("", "Every attempt gets rollout_timeout_s (no adaptive deadline)."),
}


def job_defaults() -> list[dict[str, Any]]:
    """The per-job retry/timeout defaults, each with the flag that overrides it (JobSpec.retry, .sink)."""
    from rollmesh.scheduler.grpc_sink import ACK_TIMEOUT_S
    from rollmesh.scheduler.spec import RetryPolicy

    defaults = dataclasses.asdict(RetryPolicy())
    return [
        {"field": f"retry.{name}", "default": defaults[name], "flag": flag, "doc": doc}
        for name, (flag, doc) in JOB_DEFAULTS.items()
    ] + [
        {
            "field": "sink.grpc.ack_timeout_s",
            "default": ACK_TIMEOUT_S,
            "flag": "--sink-ack-timeout",
            "doc": "A trainer sink that acknowledges nothing this long while rollouts wait fails the job.",
        }
    ]


def shown_value(name: str, *, secret: bool) -> str:
    """The variable's value in this shell as `rollmesh config` prints it: a secret only as set or not."""
    value = os.environ.get(name, "")
    return "(set, hidden)" if secret and value else value


def show_config(as_json: JsonOut = False) -> None:
    """List every ROLLMESH_* environment variable (default, value in this shell, meaning), then the
    per-job retry and timeout defaults and the flags that override them."""
    from rollmesh.mesh.config import ENV_VARS

    rows = [
        {
            "name": v.name,
            "default": "" if v.default is None else str(v.default),
            "set": shown_value(v.name, secret=v.secret),
            "doc": v.doc,
        }
        for v in sorted(ENV_VARS.values(), key=lambda v: v.name)
    ]
    jobs = job_defaults()
    if as_json:
        print_json({"variables": rows, "job_defaults": jobs})
        return
    print_table(
        "ROLLMESH_* variables",
        ["name", "default", "set here", "meaning"],
        [tuple(r.values()) for r in rows],
    )
    print_table(
        "per-job defaults (JobSpec.retry, JobSpec.sink; a flag overrides one for a job)",
        ["field", "default", "flag", "meaning"],
        [(j["field"], j["default"], j["flag"] or "(API only)", j["doc"]) for j in jobs],
    )


def register(app: typer.Typer) -> None:
    app.command("config")(show_config)
