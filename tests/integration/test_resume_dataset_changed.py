"""Resuming a job whose dataset file changed under the same path (rows edited, reordered,
removed) is refused: its stored rollouts echo the tasks they were run on, and pairing their
rewards with other tasks would give metrics of neither. The unchanged dataset resumes."""

from __future__ import annotations

import json

import pytest

from rollmesh_client import Client
from rollmesh_client import FailedPreconditionError
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.integration.test_scheduler_server import Mesh
from tests.integration.test_scheduler_server import _spec
from tests.integration.test_scheduler_server import mesh  # noqa: F401 (fixture)


async def test_resume_refuses_a_changed_dataset(mesh: Mesh) -> None:  # noqa: F811
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        first = await (await c.scheduler.submit(_spec(mesh, limit=6))).result(poll_s=0.05, timeout_s=60)
        assert pb.JobState.Name(first.state) == "JOB_STATE_SUCCEEDED", first.error
        original = mesh.data.read_text()
        rows = [json.loads(line) for line in original.splitlines()]

        same = await c.scheduler.submit(_spec(mesh, limit=6, resume_job_id=first.job_id))
        again = await same.result(poll_s=0.05, timeout_s=60)
        assert (
            pb.JobState.Name(again.state) == "JOB_STATE_SUCCEEDED" and again.progress.skipped_existing == 12
        )

        rows[2], rows[4] = rows[4], rows[2]  # reordered
        mesh.data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(FailedPreconditionError, match="indices 2, 4: the dataset changed") as refused:
            await c.scheduler.submit(_spec(mesh, limit=6, resume_job_id=first.job_id))
        assert refused.value.reason == "RESUME_SPEC_MISMATCH"

        rows[2], rows[4] = rows[4], rows[2]
        rows[1]["expected_answer"] = "999"  # edited
        mesh.data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(FailedPreconditionError, match="indices 1:"):
            await c.scheduler.submit(_spec(mesh, limit=6, resume_job_id=first.job_id))

        mesh.data.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))  # truncated
        with pytest.raises(FailedPreconditionError, match="indices 1, 3, 4, 5:"):
            await c.scheduler.submit(_spec(mesh, limit=6, resume_job_id=first.job_id))

        mesh.data.write_text(original)
        restored = await c.scheduler.submit(_spec(mesh, limit=6, resume_job_id=first.job_id))
        assert (
            pb.JobState.Name((await restored.result(poll_s=0.05, timeout_s=60)).state)
            == "JOB_STATE_SUCCEEDED"
        )
