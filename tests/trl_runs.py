"""TRL's GRPOTrainer on rollmesh rollouts, for the adapter's tests: a small CPU config, and what each
step handed the trainer (rollout_func's answer) and what the trainer made of it (its inputs to the
loss: completion and tool masks, advantages)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh_client.trl import RollmeshRollouts
from rollmesh_client.trl import environment_reward
from tests.meshes import SHIPPED

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL: said once here


@dataclass
class Run:
    trainer: Any
    rollouts: RollmeshRollouts
    answers: list[dict[str, list[Any]]] = field(default_factory=list)  # rollout_func's, per call
    scored: list[dict[str, Any]] = field(default_factory=list)  # _generate_and_score_completions', per call

    def records(self) -> dict[str, dict[str, Any]]:
        """Every row the jobs wrote, by `job/task/repeat` (rollout_func's `rollmesh_key`)."""
        rows = {}
        for path in (self.rollouts.work_dir / "jobs").glob("*/rollouts.jsonl"):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                rows[f"{row['job_id']}/{row['task_index']}/{row['rollout_index']}"] = row
        return rows


def grpo_run(
    rollouts: RollmeshRollouts,
    dataset: Any,
    out: Path,
    after: Callable[[dict[str, list[Any]], Any], None] | None = None,
    **config: Any,
) -> Run:
    """A GRPOTrainer on the shipped tiny model (CPU, float32) whose rollout_func is `rollouts`,
    recording both sides of each generation; `after(answer, trainer)` runs after each rollout_func
    call (the trainer still has the weights the batch was generated with)."""
    from trl import GRPOConfig
    from trl import GRPOTrainer

    settings: dict[str, Any] = {
        "output_dir": str(out),
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_steps": 2,
        "max_completion_length": 16,
        "learning_rate": 1e-4,
        "logging_steps": 1,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "seed": 0,
        "dataloader_num_workers": 0,
    }
    args = GRPOConfig(**(settings | config))
    run = Run(trainer=None, rollouts=rollouts)

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        answer = rollouts(prompts, trainer)
        run.answers.append(answer)
        if after is not None:
            after(answer, trainer)
        return answer

    trainer = GRPOTrainer(
        model=str(SHIPPED),
        reward_funcs=[environment_reward],
        args=args,
        train_dataset=dataset,
        rollout_func=rollout_func,
    )
    score = trainer._generate_and_score_completions

    def scored(inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = score(inputs)
        run.scored.append(output)
        return output

    trainer._generate_and_score_completions = scored
    run.trainer = trainer
    return run
