"""`rollmesh run --base-url URL` end to end: the embedded mesh on the openai backend against the
project's OpenAI test server in its own process, with a fault on every third call (a 503, which the
scheduler retries): every rollout succeeds, rewards are right and the upstream's usage is counted;
the server returns no token ids, and the rows carry no token record (and the run says so)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rollmesh.devtools.openai_server import FaultConfig, openai_server_process
from tests.procs import ROLLMESH


def test_run_against_an_openai_url_with_failing_calls(tmp_path: Path) -> None:
    faults = FaultConfig(fail_statuses=(503,), fail_every=3, retry_after_s=0.1)
    with openai_server_process(faults) as (url, _):
        done = subprocess.run(
            [
                str(ROLLMESH),
                "run",
                "--benchmark",
                "arithmetic",
                "--limit",
                "6",
                "-n",
                "2",
                "--base-url",
                url,
                "--model",
                "tiny",
                "--logprobs",
                "--output-dir",
                str(tmp_path),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and result["failure_summary"] == []
    metrics = result["metrics"]
    assert metrics["num_rollouts"] == "12" and metrics["mean_reward"] == 1.0
    assert metrics["mean_completion_tokens"] == 4.0  # "The answer is N.", as the upstream counted it
    rows = [json.loads(line) for line in Path(result["paths"]["rollouts.jsonl"]).open()]
    assert len(rows) == 12 and max(r["attempts"] for r in rows) >= 2  # some calls were retried
    # A plain OpenAI server returns no token ids (nor, here, logprobs): the rows say they have no
    # token record, rather than spans of zero length or zeros passed off as logprobs.
    assert all(r["tokens"] == {"token_ids": [], "loss_mask": [], "logprobs": [], "turns": []} for r in rows)
    assert "returned no token ids" in done.stderr
