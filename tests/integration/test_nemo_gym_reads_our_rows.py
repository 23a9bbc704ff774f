"""NeMo Gym's own tools read a rollmesh rollouts.jsonl as their own: in a nemo-gym 0.4.0 virtualenv
(scripts/nemo_gym.py venv, the nemo_gym_python fixture), NeMoGymResponse validates every row's
`response` (reasoning, message, function_call and function_call_output items), `ng_reward_profile`
profiles the file given as both its materialized inputs and its rollouts (keys `_ng_task_index` /
`_ng_rollout_index`, `agent_ref` echoed from the input rows), and its per-agent aggregation
(`compute_aggregate_metrics`, what /aggregate_metrics runs) gives rollmesh's mean reward."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.spec import JobSpec
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import Rows

AGENT = {"name": "arithmetic_simple_agent"}

CHECK = """
import json, sys
from nemo_gym.openai_utils import NeMoGymResponse
from nemo_gym.reward_profile import compute_aggregate_metrics
rows = [json.loads(line) for line in open(sys.argv[1])]
types = sorted({item.type for r in rows for item in NeMoGymResponse.model_validate(r["response"]).output})
print(json.dumps({"types": types, "agent": compute_aggregate_metrics(rows).agent_metrics}))
"""


async def run(*cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, timeout=300, check=False, cwd=cwd
    )


def with_tools(key: RolloutKey, reward: float) -> dict[str, Any]:
    """A row of an episode with every item kind: reasoning, a call, its output, the answer."""
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
    messages = [
        {"role": "assistant", "content": "", "reasoning_content": "use add", "tool_calls": [call]},
        {"role": "tool", "content": "4", "tool_call_id": "c1"},
        {"role": "assistant", "content": "4"},
    ]
    task = {"responses_create_params": {"input": "2+2?"}, "agent_ref": AGENT}
    return Rollout(key, "job-tools", task, messages, reward, prompt_tokens=9, completion_tokens=5).to_row()


async def test_nemo_gyms_profiler_and_aggregation_read_a_rollmesh_rollouts_file(
    tmp_path: Path, nemo_gym_python: Path
) -> None:
    rows = Rows.arithmetic(4)
    for r in rows.rows:  # a materialized NeMo Gym input: its _ng_ keys are not the rollouts'
        r.update(agent_ref=AGENT, _ng_task_index=0, _ng_rollout_index=0)
    mgr = JobManager(
        Catalog([Root(BUILTIN_ROOT, 0, "root")]), model=LocalModel(), env=LocalEnv(), output_dir=str(tmp_path)
    )
    try:
        rec = await mgr.submit(
            JobSpec(dataset=str(rows.write(tmp_path / "d.jsonl")), environment="arithmetic", num_repeats=3)
        )
        assert (await mgr.wait(rec.job_id)).state == "SUCCEEDED"
    finally:
        await mgr.aclose()
    path = tmp_path / rec.job_id / "rollouts.jsonl"
    with path.open("a") as f:  # two more tasks whose episodes hold every item kind
        for key, reward in ((RolloutKey(4, 0), 0.0), (RolloutKey(5, 0), 1.0)):
            f.write(json.dumps(with_tools(key, reward)) + "\n")
    ours = compute(Rollout.from_row(json.loads(line)) for line in path.read_text().splitlines())
    assert (ours.num_rollouts, ours.num_tasks) == (14, 6)

    done = await run(str(nemo_gym_python), "-c", CHECK, str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    assert theirs["types"] == ["function_call", "function_call_output", "message", "reasoning"]
    assert theirs["agent"]["mean/reward"] == pytest.approx(ours.mean_reward)

    profiler = str(nemo_gym_python.parent / "ng_reward_profile")
    inputs, rollouts = f"+materialized_inputs_jsonl_fpath={path}", f"+rollouts_jsonl_fpath={path}"
    profile = await run(profiler, inputs, rollouts, cwd=tmp_path)
    assert profile.returncode == 0, profile.stderr[-2000:]
    assert "Reward profile completion: 14/14 rollout rows" in profile.stdout, profile.stdout
    tasks = [
        json.loads(line)
        for line in (path.parent / "rollouts_reward_profiling.jsonl").read_text().splitlines()
    ]
    assert {t["_ng_task_index"]: t["mean/reward"] for t in tasks} == {
        t.task_index: pytest.approx(t.mean_reward) for t in ours.tasks
    }
    assert [
        a["agent_ref"] for a in json.loads((path.parent / "rollouts_agent_metrics.json").read_text())
    ] == [AGENT]
