"""Crash safety: a scheduler in a subprocess is SIGKILLed mid-job; a new one resumes the job by id
from its output dir. Every key ends up in rollouts.jsonl exactly once; none is lost."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from rollmesh.mesh.server import wait_serving
from rollmesh_client import Client
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.conftest import StartServer
from tests.exactly_once import check_exactly_once, expected_keys
from tests.fakes import FakeGateway, FakeVerifier, Rows


@asynccontextmanager
async def scheduler_proc(
    tmp: Path, name: str, env: dict[str, str]
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`python -m rollmesh.scheduler --port 0`; the child writes its address to ROLLMESH_PORT_FILE."""
    port_file = tmp / f"{name}.port"
    log = (tmp / f"{name}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rollmesh.scheduler",
        "--port",
        "0",
        "--output-dir",
        str(tmp / "runs"),
        env={**os.environ, **env, "ROLLMESH_PORT_FILE": str(port_file), "ROLLMESH_LOG_JSON": "1"},
        cwd=tmp,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(60):
            while not port_file.exists():  # the child's only way to tell us its port
                assert proc.returncode is None, (tmp / f"{name}.log").read_text()
                await asyncio.sleep(0.05)
        address = port_file.read_text().strip()
        await wait_serving(address, timeout_s=30)
        yield proc, address
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        log.close()


async def test_sigkill_mid_job_then_resume(start_server: StartServer, tmp_path: Path) -> None:
    gw, ver = FakeGateway(latency_s=0.005), FakeVerifier()
    fakes = await start_server([gw.binding(), ver.binding()])
    env = {"ROLLMESH_GATEWAY_ADDR": fakes.address, "ROLLMESH_VERIFIER_ADDR": fakes.address}
    data = Rows.arithmetic(150).write(tmp_path / "arith.jsonl")
    runs = tmp_path / "runs"
    spec = pb.JobSpec(
        dataset=str(data),
        environment="arithmetic",
        num_repeats=4,
        concurrency=8,
        output_dir=str(runs),
        sink=pb.SinkSpec(jsonl=pb.JsonlSinkSpec(fsync_every=16)),
    )
    total = 600

    async with scheduler_proc(tmp_path, "first", env) as (proc, address):
        async with await Client.connect(scheduler=address) as c:
            job = await c.scheduler.submit(spec)
            while (await job.get()).progress.done < 150:  # noqa: ASYNC110 (progress lives in another server)
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    job_id = job.job_id
    before = (runs / job_id / "rollouts.jsonl").read_bytes()
    assert 0 < before.count(b"\n") < total

    async with scheduler_proc(tmp_path, "second", env) as (_, address):
        async with await Client.connect(scheduler=address) as c:
            stale = await c.scheduler.get(job_id)  # from job.json: it was running when the process died
            assert pb.JobState.Name(stale.state) == "JOB_STATE_INTERRUPTED" and stale.resumable, stale
            assert f"--job-id {job_id}" in stale.error and "resume_job_id" not in stale.error
            on_disk = check_exactly_once(runs / job_id, expected_keys(150, 4), job=stale, complete=False)
            assert stale.progress.done == len(on_disk.keys) > 0  # counted from disk, not 0/600
            listed = [j async for j in c.scheduler.jobs()]  # a restarted scheduler lists its jobs
            assert [j.job_id for j in listed] == [job_id] and listed[0].state == stale.state
            # --resume: the scheduler finds the job with the same rollouts in its own results root
            resumed = await c.scheduler.submit(
                pb.JobSpec(
                    dataset=str(data),
                    environment="arithmetic",
                    num_repeats=4,
                    concurrency=8,
                    output_dir=str(runs),
                    resume_latest=True,
                )
            )
            assert resumed.job_id == job_id and resumed.last.spec.resume_job_id == job_id
            final = await resumed.result(poll_s=0.05, timeout_s=120)
            assert pb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED", final.error
            assert final.progress.skipped_existing > 0
            assert final.progress.skipped_existing + final.progress.done == total
            metrics = await resumed.metrics()
            assert metrics.num_rollouts == total

    truth = check_exactly_once(runs / job_id, expected_keys(150, 4), job=final)
    assert len(truth.rollout_keys) == total  # exactly once, none lost
