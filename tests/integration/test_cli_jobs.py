"""The CLI against a scheduler in a subprocess (fake gateway and verifier in this process):
`jobs submit --wait` and `run --scheduler` share one path and one option set; `--resume` is the
scheduler's answer; a `run` whose scheduler dies prints the job id and the exact resume command; a
restarted scheduler lists the job as INTERRUPTED with progress counted from disk; running the printed
command finishes the job exactly once (issues 15.5, 12.8, 12.4)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
from pathlib import Path

from tests.conftest import StartServer
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.fakes import FakeGateway
from tests.fakes import FakeVerifier
from tests.fakes import Rows
from tests.procs import ROLLMESH
from tests.procs import run_cli
from tests.procs import scheduler_proc


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


async def test_submit_wait_and_run_scheduler_share_options_and_resume(
    start_server: StartServer, tmp_path: Path
) -> None:
    fakes = await start_server([FakeGateway().binding(), FakeVerifier().binding()])
    env = {"ROLLMESH_GATEWAY_ADDR": fakes.address, "ROLLMESH_VERIFIER_ADDR": fakes.address}
    data = Rows.arithmetic(6).write(tmp_path / "arith.jsonl")
    job_flags = [
        "-d",
        str(data),
        "-e",
        "arithmetic",
        "-n",
        "2",
        "--max-attempts",
        "5",
        "--rollout-timeout",
        "30",
    ]
    async with scheduler_proc(tmp_path, "sched", env) as (_, address):
        # the old spelling --starting-seed still works, next to --seed
        code, out, err = await run_cli(
            "jobs", "submit", *job_flags, "--starting-seed", "7", "--wait", "--json", "--scheduler", address
        )
        assert code == 0, err
        job = json.loads(out)
        assert job["state"] == "JOB_STATE_SUCCEEDED" and int(job["spec"]["starting_seed"]) == 7
        assert job["spec"]["retry"]["max_attempts"] == 5 and job["spec"]["retry"]["rollout_timeout_s"] == 30
        first = job["job_id"]

        # run --resume: the scheduler finds no unfinished job with these settings and starts one
        code, out, err = await run_cli(
            "run", *job_flags, "--seed", "7", "--resume", "--json", "--scheduler", address
        )
        assert code == 0, err
        result = json.loads(out)
        assert "nothing to resume" in err and result["state"] == "SUCCEEDED" and result["job_id"] != first
        check_exactly_once(Path(result["paths"]["rollouts.jsonl"]).parent, expected_keys(6, 2))

        code, _, err = await run_cli("run", *job_flags, "--resume", "--job-id", first, "--scheduler", address)
        assert code == 2 and "give one" in err  # one way to say which job to resume

        # --job-id with flags naming other rollouts (another dataset, more repeats) is refused in one
        # line: the job's folder would mix two jobs' rows under one set of keys
        other = Rows.arithmetic(3).write(tmp_path / "other.jsonl")
        for changed in (["-d", str(other)], ["-n", "5"]):
            flags = [*job_flags, *changed, "--seed", "7"]
            code, _, err = await run_cli("run", *flags, "--job-id", first, "--scheduler", address)
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert code == 2 and len(errors) == 1 and "RESUME_SPEC_MISMATCH" in errors[0], err
            assert "Traceback" not in err
        check_exactly_once(tmp_path / "runs" / first, expected_keys(6, 2))  # untouched
        # the same settings resume it (nothing left to run)
        code, _, err = await run_cli(
            "run", *job_flags, "--seed", "7", "--job-id", first, "--scheduler", address
        )
        assert code == 0, err


async def test_run_survives_telling_a_scheduler_crash_then_the_printed_command_finishes_it(
    start_server: StartServer, tmp_path: Path
) -> None:
    fakes = await start_server(
        [FakeGateway(latency_s=0.05).binding(), FakeVerifier().binding()]
    )  # ~5 s of job
    env = {"ROLLMESH_GATEWAY_ADDR": fakes.address, "ROLLMESH_VERIFIER_ADDR": fakes.address}
    data = Rows.arithmetic(100).write(tmp_path / "arith.jsonl")
    runs = tmp_path / "runs"
    args = ["run", "-d", str(data), "-e", "arithmetic", "-n", "4", "-c", "4", "--json"]
    async with scheduler_proc(tmp_path, "first", env) as (sched, address):
        cli = await asyncio.create_subprocess_exec(
            str(ROLLMESH),
            *args,
            "--scheduler",
            address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **env},
        )
        async with asyncio.timeout(120):
            while not any(_lines(p) >= 20 for p in runs.glob("*/rollouts.jsonl")):
                assert cli.returncode is None
                await asyncio.sleep(0.05)
        sched.send_signal(signal.SIGKILL)
        await sched.wait()
        out, err_bytes = await asyncio.wait_for(cli.communicate(), 120)
    err = err_bytes.decode()
    assert cli.returncode == 1, err
    (job_dir,) = list(runs.iterdir())
    job_id = job_dir.name
    assert "lost the scheduler" in err and job_id in err
    command = next(
        line.strip() for line in err.splitlines() if line.strip().startswith("rollmesh run --job-id")
    )
    assert shlex.split(command) == [
        "rollmesh",
        "run",
        "--job-id",
        job_id,
        "--output-dir",
        str(runs),
        "--scheduler",
        address,
    ]

    async with scheduler_proc(tmp_path, "second", env) as (_, address2):
        code, out, err = await run_cli("jobs", "list", "--json", "--scheduler", address2)
        assert code == 0, err
        (listed,) = json.loads(out)
        assert (
            listed["job_id"] == job_id and listed["state"] == "JOB_STATE_INTERRUPTED" and listed["resumable"]
        )
        on_disk = check_exactly_once(job_dir, expected_keys(100, 4), complete=False)
        assert int(listed["progress"]["done"]) == len(on_disk.keys) >= 20  # counted from disk
        assert f"--job-id {job_id}" in listed["error"]

        code, out, err = await run_cli("jobs", "status", job_id, "--scheduler", address2)
        assert code == 0 and "INTERRUPTED" in out and f"--job-id {job_id}" in out, out + err

        again = [*shlex.split(command)[1:-1], address2, "--json"]  # the printed command, the new address
        code, out, err = await run_cli(*again, env=env)
        assert code == 0, err
        result = json.loads(out)
        assert result["job_id"] == job_id and result["state"] == "SUCCEEDED"
        code, out, _ = await run_cli("jobs", "status", job_id, "--json", "--scheduler", address2)
        from google.protobuf import json_format

        from rollmesh_client.v1 import scheduler_pb2 as pb

        final = json_format.ParseDict(json.loads(out), pb.Job())
        check_exactly_once(job_dir, expected_keys(100, 4), job=final)
