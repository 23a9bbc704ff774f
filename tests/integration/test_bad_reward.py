"""A reward that is not a finite number never reaches a job's files: a verifier (another
implementation of the proto, an older version) answering NaN or inf for some rollouts makes
those rollouts fail as VERIFIER_BAD_REWARD, counted in failures.jsonl and the metrics, and the
metrics of the rest stay finite numbers (metrics.json is strict JSON: no NaN)."""

from __future__ import annotations

import json

from rollmesh_client import Client
from rollmesh_client.v1 import scheduler_pb2 as pb
from rollmesh_client.v1 import verifier_pb2
from tests.fakes import FakeVerifier
from tests.integration.test_scheduler_server import Mesh
from tests.integration.test_scheduler_server import _rows
from tests.integration.test_scheduler_server import _spec
from tests.integration.test_scheduler_server import mesh  # noqa: F401 (fixture)


def non_finite_verdict(request: verifier_pb2.VerifyRequest) -> verifier_pb2.VerifyResult:
    """The fake's verdict, but NaN for task 3's rollouts and inf in a component for task 7's."""
    result = FakeVerifier._verdict(request)
    task_id = json.loads(request.task_json)["task_id"]
    if task_id == "arith-0003":
        result.reward = float("nan")
    elif task_id == "arith-0007":
        result.components["correct"] = float("inf")
    return result


async def test_non_finite_rewards_fail_their_rollouts(mesh: Mesh) -> None:  # noqa: F811
    mesh.verifier._verdict = non_finite_verdict  # type: ignore[method-assign]
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        final = await (await c.scheduler.submit(_spec(mesh))).result(poll_s=0.05, timeout_s=120)
    assert pb.JobState.Name(final.state) == "JOB_STATE_COMPLETED_WITH_FAILURES", final.error
    rows = _rows(mesh, final.job_id)
    assert sorted({r["task_index"] for r in rows}) == [t for t in range(20) if t not in (3, 7)]
    failures = _rows(mesh, final.job_id, "failures.jsonl")
    assert sorted((f["task_index"], f["error_class"]) for f in failures) == [
        (3, "VERIFIER_BAD_REWARD"),
        (3, "VERIFIER_BAD_REWARD"),
        (7, "VERIFIER_BAD_REWARD"),
        (7, "VERIFIER_BAD_REWARD"),
    ]
    assert "not a finite number" in failures[0]["message"]
    text = (mesh.out / final.job_id / "metrics.json").read_text()
    metrics = json.loads(text, parse_constant=lambda token: (_ for _ in ()).throw(ValueError(token)))
    assert metrics["mean_reward"] == 1.0 and metrics["failures_by_class"] == {"VERIFIER_BAD_REWARD": 4}
