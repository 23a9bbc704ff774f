"""examples/trainer_loop.py as a subprocess, fed by the real gRPC sink client (no scheduler)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.sinks.grpc import GrpcSink

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trainer_loop.py"


def rollout(t: int, i: int) -> Rollout:
    n_out = 2 + (t + i) % 3
    ids = [1, 2, 3, *range(100, 100 + n_out)]
    return Rollout(
        key=RolloutKey(t, i),
        job_id="job-ex",
        task={"task_id": f"t{t}"},
        messages=[{"role": "assistant", "content": "x"}],
        reward=1.0 if (t + i) % 2 else 0.0,
        tokens=TokenRecord(
            ids, [0, 0, 0] + [1] * n_out, [0.0] * 3 + [-0.5] * n_out, [TurnSpan(0, 3, 3 + n_out, "0")]
        ),
        policy_version="0",
    )


async def test_example_trainer_consumes_a_job_fed_through_the_grpc_sink() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "--port",
        "0",
        "--batch-size",
        "8",
        "--window",
        "16",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        async with asyncio.timeout(60):
            while True:
                line = await proc.stderr.readline()
                assert line, "the example exited before listening"
                event = json.loads(line)
                if event["event"] == "sink_listening":
                    address = event["address"]
                    break
        sink = GrpcSink(address, window=6)
        await sink.open("job-ex", total=24, spec={"num_repeats": 4})
        for i in range(4):
            for t in range(6):
                await sink.write(rollout(t, i))
        await sink.close(state="succeeded", metrics=None)
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    summary = json.loads(out)
    assert summary["rollouts"] == 24 and sum(summary["batch_sizes"]) == 24
    assert summary["batch_sizes"] == [8, 8, 8] and summary["groups_per_batch"] == [2, 2, 2]
    assert summary["max_unacked"] <= 6
    steps = [json.loads(x) for x in err.decode().splitlines() if '"train_step"' in x]
    assert len(steps) == 3 and all(abs(s["adv_mean"]) < 1e-6 for s in steps)
    assert all(s["zero_adv_groups"] == 0 for s in steps)  # each group has rewards 0 and 1
