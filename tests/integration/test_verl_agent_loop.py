"""verl's agent loop backed by rollmesh (rollmesh_client/verl.py), contract-tested against verl
0.9.1's own classes on CPU: verl's RLHFDataset reads verl rows (agent_name "rollmesh", the rollmesh
row in extra_info), `RollmeshAgentLoop` is built as verl builds agent loops and registered under
verl's registry, each sample runs as a rollmesh rollout (the fake engine playing the multi-turn
session_state counter) and verl's own `AgentLoopOutput.as_dict` makes the tensors. Checked token by
token against the job's token record: prompts + responses = the record's ids, response_mask = its
loss mask (0 on the tool results), rollout_log_probs = the replica's, rm_scores = the verdict on the
last response token; a task the environment cannot score raises, naming its class.

verl needs transformers < 5.11, so it runs in a subprocess with scripts/verl_env.py's folder (verl and
the packages it needs at other versions) first on PYTHONPATH; rollmesh's virtualenv is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.meshes import COUNTER_ROWS
from tests.meshes import SHIPPED
from tests.procs import REPO

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="session")
def verl_site() -> Path:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "verl_env.py")], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:  # PyPI out of reach: nothing of rollmesh's to test without verl
        pytest.skip(f"verl could not be installed from PyPI: {done.stderr.strip()[-300:]}")
    return Path(done.stdout.strip())


def test_verl_agent_loop_hands_verl_the_token_record(
    counter_mesh: dict[str, str], verl_site: Path, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in COUNTER_ROWS.read_text().splitlines()[:2]]
    bad = {**rows[0], "expected_answer": "seven", "task_id": "bad"}  # the environment cannot score it
    verl_rows = [
        {
            "data_source": "rollmesh",
            "prompt": row["responses_create_params"]["input"],
            "agent_name": "rollmesh",
            "reward_model": {"ground_truth": str(row["expected_answer"])},
            "extra_info": {
                "index": i,
                "rollmesh_environment": "session_state",
                "rollmesh_row": json.dumps(row),
                "rollmesh_max_steps": 4,
            },
        }
        for i, row in enumerate([*rows, bad])
    ]
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows), parquet)
    jobs = tmp_path / "jobs"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(verl_site), str(REPO / "services"), str(REPO / "clients" / "python")]
        ),
        "ROLLMESH_GATEWAY_ADDR": counter_mesh["gateway"],
        "ROLLMESH_SCHEDULER_ADDR": counter_mesh["scheduler"],
        "ROLLMESH_VERL_OUTPUT_DIR": str(jobs),
        "ROLLMESH_VERL_ROWS_DIR": str(tmp_path / "rows"),
    }
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "verl_contract.py"), str(parquet), str(SHIPPED)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["verl"], result["transformers"]) == ("0.9.1", "5.10.4")  # verl's own, not rollmesh's
    assert result["registry"] == {"_target_": "rollmesh_client.verl.RollmeshAgentLoop"}
    records = {}
    for path in jobs.glob("*/rollouts.jsonl"):
        for line in path.read_text().splitlines():  # one row per job (the failed job's file is empty)
            row = json.loads(line)
            records[f"{row['job_id']}/0/0"] = row
    *good, failed = result["samples"]
    assert failed == {"failed": failed["failed"]} and failed["failed"].startswith("BAD_TASK"), failed
    assert len(good) == 2
    for sample in good:
        record = records[sample["extra_fields"]["rollmesh_key"]]
        tokens = record["tokens"]
        start = tokens["turns"][0]["output_start"]
        assert len(tokens["turns"]) == 3  # two tool calls and the answer
        assert sample["prompt_ids"] == tokens["token_ids"][:start]
        assert sample["response_ids"] == tokens["token_ids"][start:]
        assert sample["response_mask"] == tokens["loss_mask"][start:] and 0 in sample["response_mask"]
        assert sample["response_logprobs"] == pytest.approx(tokens["logprobs"][start:])
        assert sample["reward_score"] == record["reward"] == 1.0
        assert sample["extra_fields"]["rollmesh_policy_version"] == int(record["policy_version"])
        t = sample["tensors"]  # verl's own tensors of the output
        assert t["prompts"] == sample["prompt_ids"] and t["responses"] == sample["response_ids"]
        assert t["response_mask"] == sample["response_mask"]
        assert t["rollout_log_probs"] == pytest.approx(sample["response_logprobs"])
        assert t["rm_scores"][-1] == 1.0 and not any(t["rm_scores"][:-1])
