"""Clients ride through restarts (#12.4): a real gateway process is SIGKILLed mid-job and started
again on the same port; the scheduler (a real process) waits it out within its time budget and the
job completes with every key exactly once, no rollout failed and none used an extra attempt."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rollmesh_client import SyncClient
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.exactly_once import check_exactly_once, expected_keys
from tests.fakes import Rows
from tests.procs import ROLLMESH, spawn_server

TASKS = 1500
DOWNTIME_S = 1.5  # how long the gateway stays dead: the outage under test


def _wait_done(job: object, at_least: int, timeout_s: float) -> pb.Job:
    deadline = time.monotonic() + timeout_s
    while True:
        current: pb.Job = job.get()  # type: ignore[attr-defined]
        if current.progress.done >= at_least or current.state not in (
            pb.JOB_STATE_PENDING,
            pb.JOB_STATE_RUNNING,
        ):
            return current
        assert time.monotonic() < deadline, f"job stuck at {current.progress.done}/{current.progress.total}"
        time.sleep(0.05)


def test_gateway_sigkilled_and_restarted_mid_job_the_job_completes(tmp_path: Path) -> None:
    data = Rows.arithmetic(TASKS).write(tmp_path / "arith.jsonl")
    out = tmp_path / "runs"
    gateway_cmd = [str(ROLLMESH), "serve", "gateway", "--backend", "fake"]
    with (
        spawn_server([str(ROLLMESH), "serve", "verifier", "--port", "0"]) as verifier,
        spawn_server([*gateway_cmd, "--port", "0"]) as gateway,
    ):
        port = gateway.address.rsplit(":", 1)[1]
        env = {"ROLLMESH_GATEWAY_ADDR": gateway.address, "ROLLMESH_VERIFIER_ADDR": verifier.address}
        scheduler_cmd = [str(ROLLMESH), "serve", "scheduler", "--port", "0", "--output-dir", str(out)]
        with (
            spawn_server(scheduler_cmd, env=env) as scheduler,
            SyncClient.connect(scheduler=scheduler.address) as c,
        ):
            spec = pb.JobSpec(
                dataset=str(data),
                environment="arithmetic",
                concurrency=8,
                output_dir=str(out),
                # One attempt per rollout: a rollout that waited out the outage must not have used it.
                retry=pb.RetryPolicy(max_attempts=1, unavailable_budget_s=120),
            )
            job = c.scheduler.submit(spec)
            before = _wait_done(job, 50, timeout_s=120)
            assert before.state == pb.JOB_STATE_RUNNING and before.progress.done < TASKS, (
                "job ended before the kill"
            )

            os.killpg(gateway.proc.pid, signal.SIGKILL)
            gateway.proc.wait()
            time.sleep(DOWNTIME_S)  # the gateway is down for a while: that is the fault under test
            during = job.get()
            assert during.state == pb.JOB_STATE_RUNNING and during.progress.failed == 0, during.error

            with spawn_server([*gateway_cmd, "--port", port]) as restarted:
                assert restarted.address.endswith(f":{port}")
                final: pb.Job = job.result(poll_s=0.1, timeout_s=300)

    assert final.state == pb.JOB_STATE_SUCCEEDED, final.error
    assert final.progress.succeeded == TASKS and final.progress.failed == 0
    assert final.progress.retries > 0  # rollouts did wait on the dead gateway
    check_exactly_once(out / final.job_id, expected_keys(TASKS, 1), job=final)
