"""Finding the job a `rollmesh run ... --resume` should finish: the newest unfinished job in the
output folder whose spec asks for the same rollouts (same data, environment, model, repeats,
seeds, limit, shard and sampling)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rollmesh.scheduler.spec import JobSpec

# The fields that decide which rollouts a job contains (not how fast or where they go).
IDENTITY_FIELDS = (
    "benchmark",
    "dataset",
    "environment",
    "model",
    "num_repeats",
    "starting_seed",
    "limit",
    "shard_index",
    "shard_count",
    "sampling",
    "max_steps",
)


def identity(spec: JobSpec) -> dict[str, Any]:
    data = spec.to_json()
    return {k: data[k] for k in IDENTITY_FIELDS}


def find_resumable(output_dir: Path, spec: JobSpec) -> str | None:
    """The id of the newest job under `output_dir` with the same identity that did not succeed."""
    want = identity(spec)
    candidates: list[tuple[float, str]] = []
    for job_file in output_dir.glob("*/job.json"):
        try:
            stored = json.loads(job_file.read_text())
            stored_spec = JobSpec.from_json(stored.get("spec", {}))
        except (OSError, ValueError, TypeError):
            continue
        if identity(stored_spec) == want and stored.get("state") != "SUCCEEDED":
            candidates.append(
                (float(stored.get("create_time", 0.0)), str(stored.get("job_id", job_file.parent.name)))
            )
    return max(candidates)[1] if candidates else None
