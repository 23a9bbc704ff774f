"""Proto <-> domain conversions for the scheduler's records (rollouts, failures, token records,
metrics) and OpenAI-style message dicts. The other scheduler modules that see *_pb2 are the servicer,
job_convert.py (job specs) and the scheduler's gRPC clients (its remote ports and sinks)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from rollmesh.mesh import chat
from rollmesh.scheduler.metrics import Metrics, TaskProfile
from rollmesh.scheduler.records import Json, Rollout, RolloutFailure, RolloutKey, TokenRecord, TurnSpan
from rollmesh_client.v1 import common_pb2, scheduler_pb2


def key_to_pb(key: RolloutKey) -> common_pb2.RolloutKey:
    return common_pb2.RolloutKey(task_index=key.task_index, rollout_index=key.rollout_index)


def key_from_pb(msg: common_pb2.RolloutKey) -> RolloutKey:
    return RolloutKey(int(msg.task_index), int(msg.rollout_index))


def message_to_pb(msg: Mapping[str, Any]) -> common_pb2.ChatMessage:
    """An OpenAI-style message dict (content parts flattened to their text)."""
    return chat.message_to_pb(chat.Message.from_openai(msg))


def message_from_pb(msg: common_pb2.ChatMessage) -> Json:
    return chat.message_from_pb(msg).to_openai()


def tokens_to_pb(rec: TokenRecord) -> common_pb2.TokenRecord:
    return common_pb2.TokenRecord(
        token_ids=rec.token_ids,
        loss_mask=rec.loss_mask,
        logprobs=rec.logprobs,
        turns=[
            common_pb2.TurnSpan(
                prompt_start=t.prompt_start,
                output_start=t.output_start,
                output_end=t.output_end,
                policy_version=t.policy_version,
                replica_id=t.replica_id,
            )
            for t in rec.turns
        ],
    )


def tokens_from_pb(msg: common_pb2.TokenRecord) -> TokenRecord:
    return TokenRecord(
        token_ids=list(msg.token_ids),
        loss_mask=list(msg.loss_mask),
        logprobs=list(msg.logprobs),
        turns=[
            TurnSpan(
                prompt_start=t.prompt_start,
                output_start=t.output_start,
                output_end=t.output_end,
                policy_version=t.policy_version,
                replica_id=t.replica_id,
            )
            for t in msg.turns
        ],
    )


def rollout_to_pb(r: Rollout) -> scheduler_pb2.Rollout:
    return scheduler_pb2.Rollout(
        key=key_to_pb(r.key),
        job_id=r.job_id,
        task_json=json.dumps(r.task, ensure_ascii=False),
        messages=[message_to_pb(m) for m in r.messages],
        reward=r.reward,
        reward_components=r.reward_components,
        extracted_answer=r.extracted_answer,
        verify_details_json=json.dumps(r.verify_details, ensure_ascii=False) if r.verify_details else "",
        tokens=tokens_to_pb(r.tokens),
        usage=common_pb2.Usage(
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            total_tokens=r.prompt_tokens + r.completion_tokens,
        ),
        attempts=r.attempts,
        latency_s=r.latency_s,
        policy_version=r.policy_version,
        seed=r.seed,
        finish_reason=r.finish_reason,
    )


def rollout_from_pb(msg: scheduler_pb2.Rollout) -> Rollout:
    return Rollout(
        key=key_from_pb(msg.key),
        job_id=msg.job_id,
        task=json.loads(msg.task_json) if msg.task_json else {},
        messages=[message_from_pb(m) for m in msg.messages],
        reward=msg.reward,
        reward_components=dict(msg.reward_components),
        extracted_answer=msg.extracted_answer,
        verify_details=json.loads(msg.verify_details_json) if msg.verify_details_json else {},
        tokens=tokens_from_pb(msg.tokens),
        prompt_tokens=int(msg.usage.prompt_tokens),
        completion_tokens=int(msg.usage.completion_tokens),
        attempts=msg.attempts,
        latency_s=msg.latency_s,
        policy_version=msg.policy_version,
        seed=int(msg.seed),
        finish_reason=msg.finish_reason,
    )


def failure_to_pb(f: RolloutFailure) -> scheduler_pb2.RolloutFailure:
    return scheduler_pb2.RolloutFailure(
        key=key_to_pb(f.key),
        job_id=f.job_id,
        error_class=f.error_class,
        message=f.message,
        attempts=f.attempts,
    )


def failure_from_pb(msg: scheduler_pb2.RolloutFailure) -> RolloutFailure:
    return RolloutFailure(
        key=key_from_pb(msg.key),
        job_id=msg.job_id,
        error_class=msg.error_class,
        message=msg.message,
        attempts=msg.attempts,
    )


def metrics_to_pb(m: Metrics | Mapping[str, Any]) -> scheduler_pb2.JobMetrics:
    """`Metrics` (or its JSON dict) as `JobMetrics`; fields the proto lacks stay in metrics.json."""
    if not isinstance(m, Metrics):
        m = Metrics.from_json(dict(m))
    return scheduler_pb2.JobMetrics(
        job_id=m.job_id,
        num_rollouts=m.num_rollouts,
        num_tasks=m.num_tasks,
        num_failures=m.num_failures,
        mean_reward=m.mean_reward,
        std_reward=m.std_reward,
        stderr_reward=m.stderr_reward,
        pass_at_k=m.pass_at_k,
        maj_at_k=m.maj_at_k,
        pass_at_1_avg=m.pass_at_1_avg,
        tasks=[
            scheduler_pb2.TaskProfile(
                task_index=t.task_index,
                task_id=t.task_id,
                num_rollouts=t.num_rollouts,
                mean_reward=t.mean_reward,
                std_reward=t.std_reward,
                min_reward=t.min_reward,
                max_reward=t.max_reward,
            )
            for t in m.tasks
        ],
        mean_prompt_tokens=m.mean_prompt_tokens,
        mean_completion_tokens=m.mean_completion_tokens,
        failures_by_class=m.failures_by_class,
    )


def metrics_from_pb(msg: scheduler_pb2.JobMetrics) -> Metrics:
    return Metrics(
        job_id=msg.job_id,
        num_rollouts=int(msg.num_rollouts),
        num_tasks=int(msg.num_tasks),
        num_failures=int(msg.num_failures),
        mean_reward=msg.mean_reward,
        std_reward=msg.std_reward,
        stderr_reward=msg.stderr_reward,
        pass_at_k=dict(msg.pass_at_k),
        maj_at_k=dict(msg.maj_at_k),
        k_values=sorted(msg.pass_at_k),
        pass_at_1_avg=msg.pass_at_1_avg,
        mean_prompt_tokens=msg.mean_prompt_tokens,
        mean_completion_tokens=msg.mean_completion_tokens,
        failures_by_class=dict(sorted((k, int(v)) for k, v in msg.failures_by_class.items())),
        tasks=[
            TaskProfile(
                task_index=int(t.task_index),
                task_id=t.task_id,
                num_rollouts=t.num_rollouts,
                num_correct=0,
                mean_reward=t.mean_reward,
                std_reward=t.std_reward,
                min_reward=t.min_reward,
                max_reward=t.max_reward,
            )
            for t in msg.tasks
        ],
    )


def spec_to_pb(spec: Mapping[str, Any]) -> scheduler_pb2.JobSpec:
    """A JobSpec from its dict form (`MessageToDict` shape); unknown fields are ignored."""
    return json_format.ParseDict(dict(spec), scheduler_pb2.JobSpec(), ignore_unknown_fields=True)
