"""Crash safety: a scheduler in a subprocess is SIGKILLed mid-job; a new one resumes the job by id
from its output dir. Every key ends up in rollouts.jsonl exactly once; none is lost."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from rollmesh_client import Client
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.conftest import StartServer
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.fakes import FakeGateway
from tests.fakes import FakeVerifier
from tests.fakes import Rows
from tests.procs import scheduler_proc


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

    # a metrics.json left by an earlier run of the job must not stand for the interrupted one
    (runs / job_id / "metrics.json").write_text('{"num_rollouts": 999999, "num_failures": 0}\n')

    async with scheduler_proc(tmp_path, "second", env) as (_, address):
        async with await Client.connect(scheduler=address) as c:
            stale = await c.scheduler.get(job_id)  # from job.json: it was running when the process died
            assert pb.JobState.Name(stale.state) == "JOB_STATE_INTERRUPTED" and stale.resumable, stale
            assert f"--job-id {job_id}" in stale.error and "resume_job_id" not in stale.error
            on_disk = check_exactly_once(runs / job_id, expected_keys(150, 4), job=stale, complete=False)
            assert stale.progress.done == len(on_disk.keys) > 0  # counted from disk, not 0/600
            partial = await c.scheduler.metrics(job_id)  # from the files, not an earlier metrics.json
            assert partial.num_rollouts == len(on_disk.rollout_keys)
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
