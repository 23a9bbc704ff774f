"""The mesh as a user drives it: `rollmesh up` (separate processes), `rollmesh status`, a job
submitted with the CLI and one with the SDK (sync and async), grpcurl against each service, and
`rollmesh run` interrupted then resumed with every key exactly once. The fake backend stands in
for the model here; the real Ray Serve + vLLM path has its own tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from rollmesh_client import Client
from rollmesh_client import SyncClient
from rollmesh_client.v1 import scheduler_pb2 as spb
from tests.procs import ROLLMESH
from tests.procs import grpcurl
from tests.procs import run_cli

SERVICE_NAMES = {
    "registry": "rollmesh.v1.ArtifactRegistry",
    "verifier": "rollmesh.v1.EnvironmentVerifier",
    "gateway": "rollmesh.v1.ModelGateway",
    "scheduler": "rollmesh.v1.RolloutScheduler",
}


def builtin_environments() -> int:
    """How many built-in environments there are (each a folder with an env.py)."""
    builtin = Path(__file__).resolve().parents[2] / "services/rollmesh/builtin/environments"
    return sum(1 for p in builtin.iterdir() if (p / "env.py").is_file())


def _addr_env(addrs: dict[str, str]) -> dict[str, str]:
    return {f"ROLLMESH_{k.upper()}_ADDR": v for k, v in addrs.items()}


async def test_status_shows_every_service_serving(mesh: tuple[dict[str, str], Path]) -> None:
    addrs, _ = mesh
    code, out, err = await run_cli("status", "--json", env=_addr_env(addrs))
    assert code == 0, err
    rows = {r["service"]: r for r in json.loads(out)}
    assert set(rows) == set(SERVICE_NAMES)
    assert all(r["health"] == "SERVING" for r in rows.values())
    n = builtin_environments()
    assert rows["verifier"]["detail"] in (
        f"{n} environments; code sandbox: namespaces",
        f"{n} environments; code sandbox: unsafe-process (UNSAFE opt-in)",
    )
    assert rows["gateway"]["replicas"] and rows["gateway"]["replicas"][0]["healthy"] is True


def test_grpcurl_lists_each_service(mesh: tuple[dict[str, str], Path]) -> None:
    addrs, _ = mesh
    for service, full_name in SERVICE_NAMES.items():
        res = grpcurl("-plaintext", addrs[service], "list")
        assert res.returncode == 0, res.stderr
        assert full_name in res.stdout.split() and "grpc.health.v1.Health" in res.stdout.split()
    res = grpcurl(
        "-plaintext", "-d", "{}", addrs["verifier"], "rollmesh.v1.EnvironmentVerifier/ListEnvironments"
    )
    assert res.returncode == 0, res.stderr
    names = {e["name"] for e in json.loads(res.stdout)["environments"]}
    assert {"arithmetic", "math", "code", "single_tool_call", "session_state"} <= names


def test_grpcurl_generate_many_streams_answers_and_item_errors(mesh: tuple[dict[str, str], Path]) -> None:
    """Two generations over one GenerateMany stream; the second's error comes back as its Status."""
    addrs, _ = mesh
    items = [
        {"id": "a", "request": {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}},
        {"id": "b", "request": {"prompt_token_ids": [1, 2, 3], "sampling": {"max_tokens": 0}}},
    ]
    res = grpcurl(
        "-plaintext",
        "-d",
        "\n".join(json.dumps(i) for i in items),
        addrs["gateway"],
        "rollmesh.v1.ModelGateway/GenerateMany",
    )
    assert res.returncode == 0, res.stderr
    decoder, text, answers = json.JSONDecoder(), res.stdout.strip(), {}
    while text:
        obj, end = decoder.raw_decode(text)
        answers[obj["id"]] = obj
        text = text[end:].strip()
    assert set(answers) == {"a", "b"}
    assert (
        answers["a"]["response"]["output_token_ids"] and answers["a"]["response"]["finish_reason"] == "stop"
    )
    assert answers["b"]["error"]["code"] == 3  # INVALID_ARGUMENT, the stream went on
    assert answers["b"]["error"]["details"][0]["reason"] == "INVALID_SAMPLING_PARAMS"


async def test_job_submitted_with_the_cli(mesh: tuple[dict[str, str], Path]) -> None:
    addrs, work = mesh
    code, out, err = await run_cli(
        "jobs",
        "submit",
        "--benchmark",
        "arithmetic",
        "--limit",
        "3",
        "--num-repeats",
        "2",
        "--wait",
        "--json",
        env=_addr_env(addrs),
    )
    assert code == 0, err
    job = json.loads(out)
    assert job["state"] == "JOB_STATE_SUCCEEDED"
    assert Path(job["output_path"]).parent == work / "runs"  # the scheduler's --output-dir
    rows = (Path(job["output_path"]) / "rollouts.jsonl").read_text().splitlines()
    assert len(rows) == 6


async def test_run_with_scheduler_runs_the_model_it_names(mesh: tuple[dict[str, str], Path]) -> None:
    """`run --scheduler ADDR --model NAME` asks the running gateway for NAME (it was dropped: the job
    silently ran on the gateway's default model); the default name still runs."""
    addrs, _ = mesh
    args = ("run", "--scheduler", addrs["scheduler"], "--benchmark", "arithmetic", "--limit", "2", "--json")
    code, out, err = await run_cli(*args, "--model", "not-served", "--fail-fast-after", "2")
    assert code == 4, err
    assert "MODEL_NOT_FOUND" in err and "no model or route named 'not-served'" in err
    code, out, err = await run_cli(*args, "--model", "tiny-arith")
    assert code == 0, err
    assert json.loads(out)["state"] == "SUCCEEDED"


async def test_job_submitted_with_the_async_sdk(mesh: tuple[dict[str, str], Path]) -> None:
    addrs, _ = mesh
    async with await Client.connect(**addrs) as c:
        job = await c.scheduler.submit(
            spb.JobSpec(benchmark="arithmetic", limit=2, num_repeats=3), request_id="sdk-e2e"
        )
        again = await c.scheduler.submit(
            spb.JobSpec(benchmark="arithmetic", limit=2, num_repeats=3), request_id="sdk-e2e"
        )
        assert again.job_id == job.job_id
        final = await job.result(timeout_s=120)
        assert final.state == spb.JOB_STATE_SUCCEEDED
        keys = [
            (r.rollout.key.task_index, r.rollout.key.rollout_index) async for r in job.rollouts(follow=False)
        ]
        assert sorted(keys) == [(t, i) for t in range(2) for i in range(3)]
        metrics = await job.metrics()
        assert metrics.num_rollouts == 6 and 1 in metrics.pass_at_k


def test_job_submitted_with_the_sync_sdk(mesh: tuple[dict[str, str], Path]) -> None:
    addrs, _ = mesh
    with SyncClient.connect(**addrs) as c:
        datasets = [a.name for a in c.registry.artifacts("dataset")]
        assert "arithmetic" in datasets
        job = c.scheduler.submit(spb.JobSpec(benchmark="arithmetic", limit=1, num_repeats=2))
        final = job.result(timeout_s=120)
        assert final.state == spb.JOB_STATE_SUCCEEDED and final.progress.done == 2


def _keys(rollouts: Path) -> Counter[tuple[int, int]]:
    rows = [json.loads(line) for line in rollouts.read_text().splitlines() if line.strip()]
    return Counter((r["task_index"], r["rollout_index"]) for r in rows)


def test_run_interrupted_then_resumed_has_every_key_once(tmp_path: Path) -> None:
    args = [str(ROLLMESH), "run", "--benchmark", "arithmetic", "--backend", "fake", "--concurrency", "1"]
    log = tmp_path / "first.log"
    with log.open("w") as e:
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=e, cwd=tmp_path, start_new_session=True
        )
    deadline = time.monotonic() + 180
    rollouts: list[Path] = []
    while not rollouts or len(rollouts[0].read_text().splitlines()) < 40:
        assert proc.poll() is None, f"run ended before it could be interrupted:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        rollouts = list(tmp_path.glob("runs/*/rollouts.jsonl"))
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=120) == 130, log.read_text()
    assert "rerun with --resume" in log.read_text()
    partial = _keys(rollouts[0])
    assert 40 <= sum(partial.values()) < 1600 and max(partial.values()) == 1

    done = subprocess.run(
        [*args, "--resume", "--json"], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and "resuming" in done.stderr
    assert Path(result["paths"]["rollouts.jsonl"]) == rollouts[0].resolve()
    keys = _keys(rollouts[0])
    assert set(keys) == {(t, i) for t in range(200) for i in range(8)}
    assert max(keys.values()) == 1
    assert result["metrics"]["num_rollouts"] == 1600
