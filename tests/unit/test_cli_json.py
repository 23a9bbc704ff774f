"""`--json` output: counts are JSON numbers (proto3's JSON mapping writes int64 as strings)."""

from __future__ import annotations

import json

from rollmesh.commands._common import as_dict
from rollmesh.commands._jobs import metrics_dict
from rollmesh_client.v1 import scheduler_pb2 as pb


def test_metrics_counts_are_numbers_in_maps_too() -> None:
    m = pb.JobMetrics(job_id="job-1", num_rollouts=1600, num_tasks=200, num_failures=5, mean_reward=0.5)
    m.failures_by_class["BAD_TASK"] = 5
    m.pass_at_k[1] = 0.25
    data = json.loads(json.dumps(metrics_dict(m)))
    assert data["num_rollouts"] == 1600 and data["num_tasks"] == 200 and data["num_failures"] == 5
    assert data["failures_by_class"] == {"BAD_TASK": 5}
    assert data["pass_at_k"] == {"1": 0.25} and data["mean_reward"] == 0.5


def test_job_counts_are_numbers_in_nested_and_repeated_messages() -> None:
    job = pb.Job(
        job_id="job-1",
        spec=pb.JobSpec(limit=10, starting_seed=7),
        progress=pb.JobProgress(total=1600, done=1234, failed=3),
        failure_summary=[pb.FailureClassSummary(error_class="BAD_TASK", count=3, example_message="x")],
    )
    job.create_time.FromSeconds(1_700_000_000)
    data = as_dict(job)
    assert data["progress"] == {"total": 1600, "done": 1234, "failed": 3}
    assert (data["spec"]["limit"], data["spec"]["starting_seed"]) == (10, 7)
    assert data["failure_summary"] == [{"error_class": "BAD_TASK", "count": 3, "example_message": "x"}]
    assert data["create_time"] == "2023-11-14T22:13:20Z"  # a well-known type keeps its own JSON form
    assert as_dict(pb.JobProgress(), unset_too=True)["total"] == 0
