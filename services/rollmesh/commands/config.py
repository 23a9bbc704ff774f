"""`rollmesh config`: every ROLLMESH_* variable with its default and meaning (from mesh/config.py),
and the per-job retry and timeout defaults (from scheduler/spec.py's RetryPolicy, and the gRPC
sink's ack timeout) with the flag of `rollmesh run` / `jobs submit` that overrides each for one job."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import typer

from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table


def job_defaults() -> list[dict[str, Any]]:
    """The per-job retry/timeout defaults (JobSpec.retry, .sink), each with its meaning (the field's
    own, scheduler/spec.py) and the flag that overrides it ("" when only the API sets it)."""
    from rollmesh.commands._jobs import job_flags
    from rollmesh.scheduler.sinks.grpc import ACK_TIMEOUT_S
    from rollmesh.scheduler.spec import RetryPolicy

    flags, defaults = job_flags(), RetryPolicy()
    return [
        {
            "field": f"retry.{f.name}",
            "default": getattr(defaults, f.name),
            "flag": flags.get(f.name, ""),
            "doc": f.metadata["doc"],
        }
        for f in dataclasses.fields(RetryPolicy)
    ] + [
        {
            "field": "sink.grpc.ack_timeout_s",
            "default": ACK_TIMEOUT_S,
            "flag": flags["sink_ack_timeout_s"],
            "doc": "A trainer sink that acknowledges nothing this long while rollouts wait fails the job.",
        }
    ]


def show_config(as_json: JsonOut = False) -> None:
    """List every ROLLMESH_* environment variable (default, value in this shell, meaning), then the
    per-job retry and timeout defaults and the flags that override them."""
    from rollmesh.mesh.config import ENV_VARS

    rows = [
        {
            "name": v.name,
            "default": "" if v.default is None else str(v.default),
            # the value in this shell; a secret only as set or not
            "set": "(set, hidden)" if v.secret and os.environ.get(v.name) else os.environ.get(v.name, ""),
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
