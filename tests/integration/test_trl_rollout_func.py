"""TRL's GRPOTrainer with rollmesh as its rollout engine, on the fake engine: a multi-turn tool
environment (`session_state`, played by the fake's counter agent: a tool call, a second tool call, an
answer) through `rollout_func`. Checked token by token against the token records the job wrote: TRL's
prompt + completion is the record's ids, `env_mask` its loss mask after the first prompt (0 on tool
results and template ids), and TRL trains on exactly those ids (its tool_mask x completion_mask).
Failed rollouts: a task the environment cannot score comes back unscorable (reward None, env_mask 0,
advantage 0) and the step goes on; a batch with nothing usable raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollmesh_client.trl import RollmeshRollouts
from tests.meshes import COUNTER_ROWS
from tests.trl_runs import grpo_run

pytestmark = pytest.mark.timeout(600)


def rollouts_on(mesh: dict[str, str], work: Path, **options: object) -> RollmeshRollouts:
    return RollmeshRollouts(
        environment="session_state",
        gateway=mesh["gateway"],
        scheduler=mesh["scheduler"],
        work_dir=work,
        max_steps=4,
        **options,  # type: ignore[arg-type]
    )


def test_env_mask_is_the_token_records_loss_mask(counter_mesh: dict[str, str], tmp_path: Path) -> None:
    rollouts = rollouts_on(counter_mesh, tmp_path / "work")
    run = grpo_run(rollouts, rollouts.dataset(COUNTER_ROWS), tmp_path / "out", max_completion_length=64)
    run.trainer.train()
    rollouts.close()
    records = run.records()
    assert len(run.answers) == 2 and len(run.scored) == 2
    checked = 0
    for answer, scored in zip(run.answers, run.scored, strict=True):
        tool_mask = scored["tool_mask"].tolist()
        completion_mask = scored["completion_mask"].tolist()
        for i, key in enumerate(answer["rollmesh_key"]):
            row = records[key]
            tokens = row["tokens"]
            turns = tokens["turns"]
            assert len(turns) == 3, turns  # increment_counter, get_counter_value, the answer
            start = turns[0]["output_start"]
            prompt, completion = answer["prompt_ids"][i], answer["completion_ids"][i]
            env_mask = answer["env_mask"][i]
            assert prompt == tokens["token_ids"][:start]
            assert completion == tokens["token_ids"][start:]
            assert env_mask == tokens["loss_mask"][start:]
            assert answer["logprobs"][i] == pytest.approx(tokens["logprobs"][start:])
            # token by token: 1 exactly on the ids a turn generated, 0 on tool results and template ids
            generated = {p for t in turns for p in range(t["output_start"], t["output_end"])}
            assert env_mask == [int(start + j in generated) for j in range(len(completion))]
            assert 0 in env_mask[: turns[-1]["output_start"] - start]  # the tool results in between
            # what TRL trains on: its completion mask x tool mask over this row's ids
            n = len(completion)
            trained = [c * m for c, m in zip(completion_mask[i][:n], tool_mask[i][:n], strict=True)]
            assert trained == env_mask and not any(completion_mask[i][n:])
            assert answer["env_reward"][i] == row["reward"] == 1.0
            assert answer["rollmesh_failure"][i] == ""
            checked += 1
    assert checked == 8
    # the weights the trainer had when each batch was generated: pushed, labelled with its step
    assert [(h.step, h.policy_version, h.versions) for h in rollouts.history] == [
        (0, 0, {0: 4}),
        (1, 1, {1: 4}),
    ]
    assert [p.version for p in rollouts.weights.pushes] == [0, 1]


def test_failed_rollouts_are_unscorable_and_an_empty_batch_raises(
    counter_mesh: dict[str, str], tmp_path: Path
) -> None:
    rows = [json.loads(line) for line in COUNTER_ROWS.read_text().splitlines()[:2]]
    bad = {  # the environment cannot score it: BAD_TASK, whatever the model does
        **rows[0],
        "responses_create_params": {
            **rows[0]["responses_create_params"],
            "input": [
                {
                    "role": "user",
                    "content": "The counter starts at 50. Use the tools to add 7 to it, then tell me its "
                    "value.",
                }
            ],
        },
        "expected_answer": "seven",
        "task_id": "bad",
    }
    rollouts = rollouts_on(counter_mesh, tmp_path / "work", max_replacements=1)
    dataset = rollouts.dataset([*rows, bad])
    run = grpo_run(
        rollouts,
        dataset,
        tmp_path / "out",
        per_device_train_batch_size=6,
        max_steps=1,
        max_completion_length=64,
    )
    run.trainer.train()
    (answer,), (scored,) = run.answers, run.scored
    bad_prompt = rollouts.add_rows([bad])[0]
    failed = [i for i, why in enumerate(answer["rollmesh_failure"]) if why]
    assert len(failed) == 2, answer["rollmesh_failure"]
    for i in range(6):
        if i in failed:
            assert answer["rollmesh_failure"][i].startswith("BAD_TASK"), answer["rollmesh_failure"][i]
            assert answer["env_reward"][i] is None and answer["env_mask"][i] == [0]
            assert answer["completion_ids"][i] == [run.trainer.processing_class.eos_token_id]
            assert scored["advantages"][i].item() == 0.0  # unscorable: no signal, and no loss (env_mask 0)
        else:
            assert answer["env_reward"][i] == 1.0 and answer["rollmesh_failure"][i] == ""
    (record,) = rollouts.history
    assert record.failures == {"BAD_TASK": 2} and record.groups_replaced == 1
    with pytest.raises(RuntimeError, match=r"no usable rollout.*BAD_TASK"):
        rollouts([bad_prompt, bad_prompt], run.trainer)
    rollouts.close()
