"""Proto <-> domain conversions for the scheduler's records (rollouts, failures, token records,
metrics) and OpenAI-style message dicts. The other scheduler modules that see *_pb2 are the servicer,
job_convert.py (job specs) and the scheduler's gRPC clients (its remote ports and sinks)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from rollmesh.mesh import chat
from rollmesh.mesh.fields import from_pb
from rollmesh.mesh.fields import to_pb
from rollmesh.mesh.versions import spans_from
from rollmesh.scheduler.metrics import Metrics
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.records import TurnSpan
from rollmesh.scheduler.spec import SAMPLING_FIELDS
from rollmesh.scheduler.timing import RolloutTiming
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2

_STATES = {
    name.removeprefix("JOB_STATE_").lower(): value
    for name, value in scheduler_pb2.JobState.items()
    if name != "JOB_STATE_UNSPECIFIED"
}


def state_to_pb(state: str) -> scheduler_pb2.JobState.ValueType:
    """ "succeeded", "SUCCEEDED" or "JOB_STATE_SUCCEEDED" -> JOB_STATE_SUCCEEDED (unknown: UNSPECIFIED)."""
    name = state.strip().lower().removeprefix("job_state_")
    return _STATES.get(name, scheduler_pb2.JOB_STATE_UNSPECIFIED)


def key_from_pb(msg: common_pb2.RolloutKey) -> RolloutKey:
    return from_pb(RolloutKey, msg)


def message_to_pb(msg: Mapping[str, Any]) -> common_pb2.ChatMessage:
    """An OpenAI-style message dict (content parts flattened to their text)."""
    return chat.openai_message_to_pb(msg)


def message_from_pb(msg: common_pb2.ChatMessage) -> Json:
    return chat.openai_message_from_pb(msg)


# A sampling dict's fields (SAMPLING_FIELDS but stop) and their types: a row's
# `responses_create_params` may carry numbers as strings.
_SAMPLING_TYPES: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "max_tokens": int,
    "top_k": int,
    "seed": int,
    "logprobs": bool,
}


def sampling_to_pb(s: Mapping[str, Any]) -> common_pb2.SamplingParams:
    """A sampling dict (only the fields it sets; other keys ignored) as `SamplingParams`."""
    msg = common_pb2.SamplingParams(**{k: cast(s[k]) for k, cast in _SAMPLING_TYPES.items() if k in s})
    stop = s.get("stop")
    if stop:
        msg.stop.extend([stop] if isinstance(stop, str) else [str(x) for x in stop])
    return msg


def sampling_from_pb(msg: common_pb2.SamplingParams) -> Json:
    """The fields `msg` sets, as a sampling dict (in SAMPLING_FIELDS order)."""
    out: Json = {}
    for name in SAMPLING_FIELDS:
        if name == "stop":
            if msg.stop:
                out["stop"] = list(msg.stop)
        elif msg.HasField(name):  # type: ignore[arg-type]
            out[name] = getattr(msg, name)
    return out


def rollout_to_pb(r: Rollout) -> scheduler_pb2.Rollout:
    return to_pb(
        scheduler_pb2.Rollout,
        r,
        task_json=json.dumps(r.task, ensure_ascii=False),
        messages=[message_to_pb(m) for m in r.messages],
        verify_details_json=json.dumps(r.verify_details, ensure_ascii=False) if r.verify_details else "",
        agent_program_json=json.dumps(r.agent_program, ensure_ascii=False) if r.agent_program else "",
        timing_json=json.dumps(r.timing.to_json()) if r.timing is not None else "",
        env_steps=[
            scheduler_pb2.EnvStepRecord(
                reward=float(s.get("reward", 0.0)),
                done=bool(s.get("done", False)),
                info_json=json.dumps(s["info"], ensure_ascii=False) if s.get("info") else "",
            )
            for s in r.env_steps
        ],
        usage=common_pb2.Usage(
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            total_tokens=r.prompt_tokens + r.completion_tokens,
        ),
    )


def rollout_from_pb(msg: scheduler_pb2.Rollout) -> Rollout:
    return from_pb(
        Rollout,
        msg,
        key=key_from_pb(msg.key),
        task=json.loads(msg.task_json) if msg.task_json else {},
        messages=[message_from_pb(m) for m in msg.messages],
        verify_details=json.loads(msg.verify_details_json) if msg.verify_details_json else {},
        agent_program=json.loads(msg.agent_program_json) if msg.agent_program_json else {},
        timing=RolloutTiming.from_json(json.loads(msg.timing_json)) if msg.timing_json else None,
        tokens=from_pb(
            TokenRecord,
            msg.tokens,
            turns=[from_pb(TurnSpan, t, versions=spans_from(t.versions)) for t in msg.tokens.turns],
        ),
        env_steps=[
            {"reward": s.reward, "done": s.done, "info": json.loads(s.info_json) if s.info_json else {}}
            for s in msg.env_steps
        ],
        prompt_tokens=msg.usage.prompt_tokens,
        completion_tokens=msg.usage.completion_tokens,
    )


def failure_to_pb(f: RolloutFailure) -> scheduler_pb2.RolloutFailure:
    program = json.dumps(f.agent_program, ensure_ascii=False) if f.agent_program else ""
    return to_pb(scheduler_pb2.RolloutFailure, f, agent_program_json=program)


def metrics_to_pb(m: Metrics | Mapping[str, Any]) -> scheduler_pb2.JobMetrics:
    """`Metrics` (or its JSON dict) as `JobMetrics`; fields the proto lacks stay in metrics.json."""
    return to_pb(scheduler_pb2.JobMetrics, m if isinstance(m, Metrics) else Metrics.from_json(dict(m)))


def spec_to_pb(spec: Mapping[str, Any]) -> scheduler_pb2.JobSpec:
    """A JobSpec from its dict form (`MessageToDict` shape); unknown fields are ignored."""
    return json_format.ParseDict(dict(spec), scheduler_pb2.JobSpec(), ignore_unknown_fields=True)
