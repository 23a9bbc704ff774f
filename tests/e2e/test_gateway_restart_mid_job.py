"""Clients ride through restarts (#12.4): a real gateway process is SIGKILLed mid-job and started
again on the same port; the scheduler (a real process) waits it out within its time budget and the
job completes with every key exactly once, no rollout failed and none used an extra attempt."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from pathlib import Path

from rollmesh_client import SyncClient
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.fakes import Rows
from tests.procs import ROLLMESH
from tests.procs import spawn_server

TASKS = 1500
DOWNTIME_S = 1.5  # how long the gateway stays dead: the outage under test


def _port_outside_the_ephemeral_range() -> int:
    """A free port the kernel never hands out for port 0, so nothing else takes it while the gateway
    is dead (an ephemeral port could be given to another test's server in that window)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


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
    gateway_cmd = [str(ROLLMESH), "serve", "gateway", "--backend", "fake", "--http-port", "-1"]
    with (
        spawn_server([str(ROLLMESH), "serve", "verifier", "--port", "0"]) as verifier,
        spawn_server([*gateway_cmd, "--port", str(port := _port_outside_the_ephemeral_range())]) as gateway,
    ):
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
            # The gateway stays dead for DOWNTIME_S (the fault under test); meanwhile the job says
            # what it waits on, and nothing fails.
            waited_on: set[str] = set()
            down_until = time.monotonic() + DOWNTIME_S
            while time.monotonic() < down_until:
                during = job.get()
                assert during.state == pb.JOB_STATE_RUNNING and during.progress.failed == 0, during.error
                waited_on.add(during.progress.waiting_on.partition(" for ")[0])
                time.sleep(0.1)
            assert "gateway unreachable" in waited_on, waited_on

            with spawn_server([*gateway_cmd, "--port", str(port)]) as restarted:
                assert restarted.address.endswith(f":{port}")
                final: pb.Job = job.result(poll_s=0.1, timeout_s=300)

    assert final.state == pb.JOB_STATE_SUCCEEDED, final.error
    assert final.progress.succeeded == TASKS and final.progress.failed == 0
    assert final.progress.retries > 0 and not final.progress.waiting_on  # they waited, then carried on
    check_exactly_once(out / final.job_id, expected_keys(TASKS, 1), job=final)
