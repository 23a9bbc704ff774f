"""verl's agent loop backed by rollmesh: `agent_name: rollmesh` in a verl dataset runs each sample as
one rollmesh rollout (any environment: built-in, NeMo Gym-bridged, verifiers, reasoning-gym; tools
and environment turns included) and hands verl the token record (docs/training.md, "verl").

    # verl config: actor_rollout_ref.rollout.agent.agent_loop_config_path -> a YAML with
    #   - name: rollmesh
    #     _target_: rollmesh_client.verl.RollmeshAgentLoop
    # each dataset row: agent_name "rollmesh", extra_info.rollmesh_row (the rollmesh / NeMo Gym row)
    # and extra_info.rollmesh_environment (or ROLLMESH_VERL_ENVIRONMENT)

verl's `AgentLoopOutput` comes from the record: `prompt_ids` the ids before the first generated
one, `response_ids` everything after (the model's turns, tool results), `response_mask` the loss
mask over them (1 on generated ids: verl's multi-turn mask), `response_logprobs` the replica's, and
`reward_score` the environment's verdict (verl puts it on the last response token as `rm_scores`).
A rollout rollmesh could not produce (its attempts failed, a masked verdict, a record of several
segments) raises `RollmeshRolloutFailed` naming why: verl's reward path has no "unscorable" sample,
and a 0 there would train as a verdict.

Generation runs on rollmesh's replicas (the gateway at ROLLMESH_GATEWAY_ADDR, the scheduler at
ROLLMESH_SCHEDULER_ADDR), not on verl's own rollout servers: the trainer's weights must reach them
through UpdateWeights (`rollmesh_client.trl.RollmeshWeightTransfer.send_weights` takes verl's
`(name, tensor)` stream as it takes TRL's). Needs verl (tested with 0.9.1 in a side environment:
scripts/verl_env.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import register

from rollmesh_client._client import Client
from rollmesh_client._rollout import TrainerRollout
from rollmesh_client.trl._samples import as_rollmesh_row
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2


class RollmeshRolloutFailed(RuntimeError):
    """rollmesh produced no trainable record for a sample (the message names the class)."""


def rollmesh_row(fields: dict[str, Any]) -> dict[str, Any]:
    """The rollmesh row of a verl sample: `extra_info.rollmesh_row`, else one made of verl's
    `raw_prompt` and `reward_model.ground_truth` (as `expected_answer`)."""
    extra = fields.get("extra_info") or {}
    given = extra.get("rollmesh_row")
    if given:
        return as_rollmesh_row(json.loads(given) if isinstance(given, str) else dict(given))
    messages = [{"role": str(m["role"]), "content": m["content"]} for m in fields["raw_prompt"]]
    row: dict[str, Any] = {"responses_create_params": {"input": messages}}
    truth = (fields.get("reward_model") or {}).get("ground_truth")
    if truth is not None:
        row["expected_answer"] = truth
    return row


def sampling_of(sampling_params: dict[str, Any], response_length: int) -> common_pb2.SamplingParams:
    """verl's sampling params (temperature, top_p, top_k; -1 or 0: off) as rollmesh's, each turn's
    max_tokens the rollout's `response_length`, logprobs recorded."""
    s = common_pb2.SamplingParams(
        temperature=float(sampling_params.get("temperature", 1.0)), logprobs=True, max_tokens=response_length
    )
    if float(sampling_params.get("top_p", 1.0)) < 1.0:
        s.top_p = float(sampling_params["top_p"])
    if int(sampling_params.get("top_k", -1)) > 0:
        s.top_k = int(sampling_params["top_k"])
    return s


def _seconds(value: Any) -> float:
    """A timing entry: seconds, or a list of them (one per turn or call)."""
    if isinstance(value, list):
        return float(sum(value))
    return float(value or 0.0)


@register("rollmesh")
class RollmeshAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """One verl sample = one rollmesh rollout (see the module)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        extra = kwargs.get("extra_info") or {}
        environment = extra.get("rollmesh_environment") or os.environ.get("ROLLMESH_VERL_ENVIRONMENT", "")
        if not environment:
            raise ValueError(
                "no rollmesh environment: set extra_info.rollmesh_environment or ROLLMESH_VERL_ENVIRONMENT"
            )
        row = rollmesh_row(kwargs)
        response_length = int(self.rollout_config.response_length)
        spec = scheduler_pb2.JobSpec(
            environment=environment,
            num_repeats=1,
            sampling=sampling_of(sampling_params, response_length),
            # verl runs a prompt's n samples as n calls with the same row: each its own seed
            starting_seed=secrets.randbits(31),
            output_dir=os.environ.get("ROLLMESH_VERL_OUTPUT_DIR", "runs/verl"),
        )
        if extra.get("rollmesh_max_steps"):
            spec.agent.max_steps = int(extra["rollmesh_max_steps"])
        rollout, failure = await self._one_rollout(spec, row)
        if rollout is None:
            raise RollmeshRolloutFailed(failure)
        if rollout.masked or len(rollout.segments) > 1 or not rollout.token_ids or rollout.logprobs is None:
            why = (
                "MASKED"
                if rollout.masked
                else "SEGMENTED_TOKEN_RECORD"
                if rollout.token_ids
                else "NO_TOKEN_RECORD"
            )
            raise RollmeshRolloutFailed(f"{why}: rollout {rollout.job_id}/0/0 has nothing verl can train on")
        start = rollout.prompt_length
        timing = rollout.timing
        return AgentLoopOutput(
            prompt_ids=rollout.token_ids[:start],
            response_ids=rollout.token_ids[start:],
            response_mask=rollout.loss_mask[start:],
            response_logprobs=rollout.logprobs[start:],
            reward_score=rollout.reward,
            num_turns=1 + len(rollout.raw.messages),
            metrics=AgentLoopMetrics(
                generate_sequences=_seconds(timing.get("model_s")),
                tool_calls=_seconds(timing.get("tool_s")),
                compute_score=_seconds(timing.get("verify_s")),
            ),
            extra_fields={
                "rollmesh_policy_version": rollout.version,
                "rollmesh_key": f"{rollout.job_id}/0/0",
                "rollmesh_finish_reason": rollout.finish_reason,
            },
        )

    async def _one_rollout(
        self, spec: scheduler_pb2.JobSpec, row: dict[str, Any]
    ) -> tuple[TrainerRollout | None, str]:
        """The sample as a one-row job: its rollout, or why there is none."""
        path = await asyncio.to_thread(_write_row, row)
        spec.dataset = str(path)
        try:
            async with await Client.connect(timeout_s=120.0) as client:
                job = await client.scheduler.submit(spec)
                failure = "MISSING: the job ended without the rollout"
                async for item in job.rollouts(follow=True, include_failures=True):
                    if item.HasField("rollout"):
                        r = TrainerRollout.from_pb(item.rollout)
                        r.job_id = job.job_id
                        return r, ""
                    failure = f"{item.failure.error_class}: {item.failure.message}"
                final = await job.get()
                return None, failure + (f" ({final.error})" if final.error else "")
        finally:
            await asyncio.to_thread(path.unlink, True)


def _write_row(row: dict[str, Any]) -> Path:
    """The one-row dataset the scheduler reads (ROLLMESH_VERL_ROWS_DIR, a path it shares; else tmp)."""
    folder = Path(os.environ.get("ROLLMESH_VERL_ROWS_DIR") or tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", dir=folder, delete=False) as f:
        f.write(json.dumps(row) + "\n")
    return Path(f.name)
