"""Honest job outcomes over real gRPC: the scheduler service with a fake gateway that rejects calls,
the SDK's view (state, failure summary, metrics by class) and the `rollmesh` CLI's exit codes."""

from __future__ import annotations

import json

import grpc

from rollmesh_client import Client
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.integration.test_scheduler_server import Mesh
from tests.integration.test_scheduler_server import _rows
from tests.integration.test_scheduler_server import _spec
from tests.integration.test_scheduler_server import mesh  # noqa: F401 (fixture)
from tests.procs import run_cli


def _submit_args(m: Mesh, *extra: str) -> list[str]:
    return [
        "jobs",
        "submit",
        "--scheduler",
        m.scheduler_addr,
        "--dataset",
        str(m.data),
        "--environment",
        "arithmetic",
        "--output-dir",
        str(m.out),
        "--concurrency",
        "1",
        "--wait",
        *extra,
    ]


async def test_permanent_failures_end_completed_with_failures(mesh: Mesh) -> None:  # noqa: F811
    mesh.gateway.faults.fail("Generate", grpc.StatusCode.INVALID_ARGUMENT, times=3, message="prompt too long")
    async with await Client.connect(scheduler=mesh.scheduler_addr) as c:
        job = await c.scheduler.submit(_spec(mesh, concurrency=1))
        final = await job.result(poll_s=0.05, timeout_s=60)
        metrics = await job.metrics()
    assert pb.JobState.Name(final.state) == "JOB_STATE_COMPLETED_WITH_FAILURES", final.error
    assert "3 of 40 rollouts failed permanently (allowed: 0" in final.error
    assert [(f.error_class, f.count, f.example_message) for f in final.failure_summary] == [
        ("INVALID_ARGUMENT", 3, "prompt too long")
    ]
    assert dict(metrics.failures_by_class) == {"INVALID_ARGUMENT": 3}
    assert len(_rows(mesh, final.job_id, "failures.jsonl")) == 3 and len(_rows(mesh, final.job_id)) == 37
    code, out, err = await run_cli("jobs", "status", final.job_id, "--scheduler", mesh.scheduler_addr)
    assert code == 0, err
    assert "failed: INVALID_ARGUMENT" in out and "3 (e.g. prompt too long)" in out


async def test_cli_exit_codes_tell_the_outcome(mesh: Mesh) -> None:  # noqa: F811
    mesh.gateway.faults.fail("Generate", grpc.StatusCode.INVALID_ARGUMENT, times=2, message="prompt too long")
    code, _, err = await run_cli(*_submit_args(mesh))
    assert code == 3, err
    assert "completed_with_failures" in err and "INVALID_ARGUMENT" in err and "prompt too long" in err

    mesh.gateway.faults.fail("Generate", grpc.StatusCode.INVALID_ARGUMENT, times=2, message="prompt too long")
    code, _, err = await run_cli(*_submit_args(mesh, "--allowed-failures", "2"))
    assert code == 0, err

    mesh.gateway.faults.fail("Generate", grpc.StatusCode.INVALID_ARGUMENT, times=2, message="prompt too long")
    code, _, err = await run_cli(*_submit_args(mesh, "--allowed-failures", "5%"))  # 5% of 20 = 1 < 2
    assert code == 3, err


async def test_every_call_unauthenticated_fails_fast_with_exit_4(mesh: Mesh) -> None:  # noqa: F811
    mesh.gateway.faults.fail(
        "Generate", grpc.StatusCode.UNAUTHENTICATED, times=-1, message="bad bearer token"
    )
    big = mesh.data.parent / "big.jsonl"
    big.write_text(mesh.data.read_text() * 25)  # 500 rows: fail fast must not burn through them
    args = _submit_args(mesh)
    args[args.index("--dataset") + 1] = str(big)
    code, out, err = await run_cli(*args, "--json", "--fail-fast-after", "5")
    assert code == 4, err
    assert "5 rollouts in a row failed with UNAUTHENTICATED" in err and "bad bearer token" in err
    assert mesh.gateway.faults.calls["Generate"] < 20
    job = json.loads(out)
    assert (
        job["state"] == "JOB_STATE_FAILED" and job["failure_summary"][0]["error_class"] == "UNAUTHENTICATED"
    )
