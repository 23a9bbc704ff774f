"""Aggregation after a crash: a scheduler SIGKILLed mid-job and resumed by another one leaves
exactly the rollouts the job asked for, each with the reward its own answer earned, and
metrics.json (and the Metrics RPC) equal numbers computed here by hand from the definitions, with
plain `json` and `math.comb` (not the code under test): pass@k, maj@k, pass@1 averages, mean and
per-task profiles. The model's answers depend on the rollout's key, so right and wrong answers
mix within a task and a majority can be wrong: a duplicate, a lost rollout or a rollout scored
under another key would change a number."""

from __future__ import annotations

import asyncio
import json
import math
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from rollmesh_client import Client
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.conftest import StartServer
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.fakes import FakeGateway
from tests.fakes import FakeVerifier
from tests.fakes import Json
from tests.fakes import Rows
from tests.fakes import solve
from tests.procs import scheduler_proc

TASKS, REPEATS = 40, 4


def right(task: int, rollout: int) -> bool:
    """Which rollouts answer right: none of task 0 mod 5, all of task 1 mod 5, else a mix."""
    if task % 5 == 0:
        return False
    return task % 5 == 1 or (task + rollout) % 3 != 0


def key_script(req: gateway_pb2.GenerateRequest, turn: int) -> Json:
    """The answer for the rollout named by the request id (job/task/rollout/step). Wrong answers
    agree with each other on even tasks (so a wrong majority can win) and differ on odd ones."""
    _job, task, rollout, _step = req.request_id.rsplit("/", 3)
    t, r = int(task), int(rollout)
    truth = solve(next(m.content for m in req.messages if m.role == "user"))
    if right(t, r):
        return {"content": truth}
    return {"content": str(int(truth) + (1 if t % 2 == 0 else 1 + r))}


def by_hand(rows: list[dict[str, Any]], k_values: list[int]) -> dict[str, Any]:
    tasks: dict[int, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda x: (x["task_index"], x["rollout_index"])):
        tasks.setdefault(row["task_index"], []).append(row)
    rewards = [row["reward"] for row in rows]

    def correct(rs: list[dict[str, Any]]) -> int:
        return sum(1 for x in rs if x["reward"] >= 1.0)

    def majority(rs: list[dict[str, Any]]) -> float:
        votes = Counter(x["extracted_answer"] for x in rs if x["extracted_answer"])
        top = max(votes.values())
        winner = next(x for x in rs if votes[x["extracted_answer"]] == top)  # first tied answer wins
        return 1.0 if winner["reward"] >= 1.0 else 0.0

    out: dict[str, Any] = {
        "num_rollouts": len(rows),
        "num_tasks": len(tasks),
        "mean_reward": sum(rewards) / len(rewards),
        "pass_at_1_avg": sum(correct(rs) / len(rs) for rs in tasks.values()) / len(tasks),
        "pass_at_k": {},
        "maj_at_k": {},
        "pass_at_1_avg_of_k": {},
        "tasks": [
            (t, len(rs), correct(rs), sum(x["reward"] for x in rs) / len(rs)) for t, rs in tasks.items()
        ],
    }
    for k in k_values:
        per_task = [1 - math.comb(len(rs) - correct(rs), k) / math.comb(len(rs), k) for rs in tasks.values()]
        out["pass_at_k"][str(k)] = sum(per_task) / len(tasks)
        out["maj_at_k"][str(k)] = sum(majority(rs[:k]) for rs in tasks.values()) / len(tasks)
        out["pass_at_1_avg_of_k"][str(k)] = sum(correct(rs[:k]) / k for rs in tasks.values()) / len(tasks)
    return out


def close(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) if isinstance(a, float) else bool(a == b)


async def test_metrics_after_sigkill_and_resume_match_a_hand_count(
    start_server: StartServer, tmp_path: Path
) -> None:
    gw, ver = FakeGateway(script=key_script, latency_s=0.01), FakeVerifier()
    fakes = await start_server([gw.binding(), ver.binding()])
    env = {"ROLLMESH_GATEWAY_ADDR": fakes.address, "ROLLMESH_VERIFIER_ADDR": fakes.address}
    data = Rows.arithmetic(TASKS).write(tmp_path / "arith.jsonl")
    runs = tmp_path / "runs"
    spec = pb.JobSpec(
        dataset=str(data),
        environment="arithmetic",
        num_repeats=REPEATS,
        concurrency=8,
        output_dir=str(runs),
        sink=pb.SinkSpec(jsonl=pb.JsonlSinkSpec(fsync_every=4)),
    )
    async with scheduler_proc(tmp_path, "first", env) as (proc, address):
        async with await Client.connect(scheduler=address) as c:
            job = await c.scheduler.submit(spec)
            while (await job.get()).progress.done < TASKS:  # noqa: ASYNC110 (progress lives in another server)
                await asyncio.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    folder = runs / job.job_id
    assert 0 < (folder / "rollouts.jsonl").read_bytes().count(b"\n") < TASKS * REPEATS

    async with scheduler_proc(tmp_path, "second", env) as (_, address):
        async with await Client.connect(scheduler=address) as c:
            resumed = await c.scheduler.submit(
                pb.JobSpec(
                    dataset=str(data),
                    environment="arithmetic",
                    num_repeats=REPEATS,
                    concurrency=8,
                    output_dir=str(runs),
                    resume_job_id=job.job_id,
                )
            )
            final = await resumed.result(poll_s=0.05, timeout_s=180)
            assert pb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED", final.error
            assert final.progress.skipped_existing > 0
            served = await resumed.metrics()

    check_exactly_once(folder, expected_keys(TASKS, REPEATS), job=final, complete=True)
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    # each rollout carries the reward of its own key's answer: nothing scored under another key
    wrong = [
        (r["task_index"], r["rollout_index"])
        for r in rows
        if (r["reward"] == 1.0) != right(r["task_index"], r["rollout_index"])
    ]
    assert not wrong, wrong

    metrics = json.loads((folder / "metrics.json").read_text())
    assert (
        metrics["k_values"] == [1, 2, 4] and metrics["num_duplicates"] == 0 and metrics["num_failures"] == 0
    )
    hand = by_hand(rows, metrics["k_values"])
    got = {name: metrics[name] for name in hand if name != "tasks"}
    got["tasks"] = [
        (t["task_index"], t["num_rollouts"], t["num_correct"], t["mean_reward"]) for t in metrics["tasks"]
    ]
    assert close(hand, got), (hand, got)
    # the numbers are not degenerate: some tasks all right, some all wrong, some wrong majorities
    assert 0 < hand["pass_at_k"]["1"] < hand["pass_at_k"]["4"] < 1
    assert hand["maj_at_k"]["4"] < hand["pass_at_k"]["4"]
    # the Metrics RPC says the same as the file
    assert served.num_rollouts == TASKS * REPEATS
    assert math.isclose(served.mean_reward, hand["mean_reward"], rel_tol=1e-6)
    assert {k: round(v, 6) for k, v in served.pass_at_k.items()} == {
        int(k): round(v, 6) for k, v in hand["pass_at_k"].items()
    }
    assert {k: round(v, 6) for k, v in served.maj_at_k.items()} == {
        int(k): round(v, 6) for k, v in hand["maj_at_k"].items()
    }
