"""`rollmesh run --sink-grpc ADDR --sink-ack-timeout S`, end to end (embedded mesh, fake model): the
gRPC sink's ack timeout was settable only through the API, so a CLI job waited the default 300 s
on a trainer that consumed nothing before failing."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rollmesh.mesh.server import wait_serving
from rollmesh_client.trainer import SinkServer
from tests.procs import run_cli

ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is 2 + 3?"}]},
    "expected_answer": "5",
}


async def test_a_stalled_trainer_fails_the_job_after_the_ack_timeout_given(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROW) + "\n")
    async with SinkServer() as trainer:  # started, and never consumes: nothing is acknowledged
        await wait_serving(trainer.address, timeout_s=30)
        t0 = time.monotonic()
        code, _, err = await run_cli(
            *("run", "--input", str(rows), "--environment", "arithmetic", "--backend", "fake"),
            *("-o", str(tmp_path / "runs"), "--sink-grpc", trainer.address, "--sink-ack-timeout", "1"),
        )
        took = time.monotonic() - t0
    said = " ".join(err.split())
    assert code == 4, err  # FAILED
    assert f"trainer sink {trainer.address}: 1 rollouts sent were never acknowledged" in said, said
    assert took < 100, took  # the default would have waited 300 s for the acknowledgement
    code, _, err = await run_cli("jobs", "submit", "-b", "arithmetic", "--sink-ack-timeout", "5")
    assert code == 2 and "--sink-ack-timeout is the --sink-grpc trainer's" in " ".join(err.split()), err
