"""The domain records a job produces: rollouts, failures, token records. No grpc here.

A rollout's JSONL row is NeMo Gym-compatible: the input row's fields echoed, plus `response`,
`reward`, the rollout key and the token record (see `Rollout.to_row`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rollmesh.scheduler.timing import RolloutTiming

Json = dict[str, Any]


@dataclass(frozen=True, order=True)
class RolloutKey:
    """Stable identity of a rollout in a job: the same key is the same rollout."""

    task_index: int
    rollout_index: int

    def as_str(self) -> str:
        return f"{self.task_index}:{self.rollout_index}"


@dataclass(frozen=True)
class TurnSpan:
    prompt_start: int
    output_start: int
    output_end: int
    policy_version: str = ""
    replica_id: str = ""


@dataclass
class TokenRecord:
    """Every token of a multi-turn rollout, with a loss mask and aligned logprobs (all one length).

    `logprobs_recorded` False: the job did not ask for logprobs and they are all 0, not the policy's.
    Not given (None: a row or message from before the field), it becomes whether any generated id
    has a non-zero logprob: an old job that asked has them, one that did not wrote zeros only."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[TurnSpan] = field(default_factory=list)
    logprobs_recorded: bool | None = None

    def __post_init__(self) -> None:
        if self.logprobs_recorded is None:
            self.logprobs_recorded = any(
                lp != 0.0 for lp, m in zip(self.logprobs, self.loss_mask, strict=False) if m
            )

    def to_json(self) -> Json:
        return {
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "logprobs_recorded": self.logprobs_recorded,
            "turns": [t.__dict__ for t in self.turns],
        }

    @classmethod
    def from_json(cls, data: Json) -> TokenRecord:
        recorded = data.get("logprobs_recorded")
        return cls(
            token_ids=list(data.get("token_ids", [])),
            loss_mask=list(data.get("loss_mask", [])),
            logprobs=[float(x) for x in data.get("logprobs", [])],
            turns=[TurnSpan(**t) for t in data.get("turns", [])],
            logprobs_recorded=None if recorded is None else recorded is True,
        )


@dataclass
class Rollout:
    """One finished rollout."""

    key: RolloutKey
    job_id: str
    task: Json  # the input row, echoed
    messages: list[Json]  # OpenAI-style messages after the input: assistant turns and tool results
    reward: float
    reward_components: dict[str, float] = field(default_factory=dict)
    extracted_answer: str = ""
    verify_details: Json = field(default_factory=dict)
    tokens: TokenRecord = field(default_factory=TokenRecord)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 1
    latency_s: float = 0.0
    policy_version: str = ""
    seed: int = 0
    finish_reason: str = ""
    #: An environment that takes turns: each step's {"reward", "done", "info"}, in order (`reward`
    #: is their rewards plus verify's). Empty, and absent from the row, otherwise.
    env_steps: list[Json] = field(default_factory=list)
    masked: bool = False  # the verifier masked the verdict: `reward` is no measurement
    #: Where the rollout's time went (timing.py); None for rows written before rollmesh recorded it.
    timing: RolloutTiming | None = None

    def to_row(self) -> Json:
        """The JSONL output row: the input echoed, then what rollmesh adds (`env_steps` only when
        the environment took turns)."""
        row = dict(self.task)
        row.update(
            {
                "task_index": self.key.task_index,
                "rollout_index": self.key.rollout_index,
                "job_id": self.job_id,
                "response": {"output": self.messages, "finish_reason": self.finish_reason},
                "reward": self.reward,
                "reward_components": self.reward_components,
                "extracted_answer": self.extracted_answer,
                "verify_details": self.verify_details,
                "tokens": self.tokens.to_json(),
                "usage": {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "total_tokens": self.prompt_tokens + self.completion_tokens,
                },
                "attempts": self.attempts,
                "latency_s": self.latency_s,
                "policy_version": self.policy_version,
                "seed": self.seed,
                "mask_sample": self.masked,
            }
        )
        if self.env_steps:
            row["env_steps"] = self.env_steps
        if self.timing is not None:
            row["timing"] = self.timing.to_json()
        return row

    @classmethod
    def from_row(cls, row: Json) -> Rollout:
        """Inverse of to_row (the task is every field rollmesh did not add)."""
        task = {k: v for k, v in row.items() if k not in _ADDED_FIELDS}
        usage = row.get("usage", {})
        response = row.get("response", {})
        return cls(
            key=RolloutKey(int(row["task_index"]), int(row["rollout_index"])),
            job_id=str(row.get("job_id", "")),
            task=task,
            messages=list(response.get("output", [])),
            reward=_finite("reward", row.get("reward", 0.0)),
            reward_components={
                k: _finite(f"reward_components.{k}", v) for k, v in row.get("reward_components", {}).items()
            },
            extracted_answer=str(row.get("extracted_answer", "")),
            verify_details=dict(row.get("verify_details", {})),
            tokens=TokenRecord.from_json(row.get("tokens", {})),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            attempts=int(row.get("attempts", 1)),
            latency_s=float(row.get("latency_s", 0.0)),
            policy_version=str(row.get("policy_version", "")),
            seed=int(row.get("seed", 0)),
            finish_reason=str(response.get("finish_reason", "")),
            env_steps=[dict(s) for s in row.get("env_steps", [])],
            masked=row.get("mask_sample") is True,
            timing=RolloutTiming.from_json(row["timing"]) if isinstance(row.get("timing"), dict) else None,
        )


def _finite(name: str, value: Any) -> float:
    """A stored reward: a NaN or infinity (never written by the scheduler: BadReward) would poison every
    mean it enters, so the row is refused as corrupt; so is one that is not a number (true read as 1.0,
    "0.9" as 0.9: a row edited or written by something else)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is {value!r:.40}, not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} is {number}, not a finite number")
    return number


# What `to_row` adds to the echoed task (the row of a rollout of an empty task, `env_steps` included).
_ADDED_FIELDS = frozenset(
    Rollout(RolloutKey(0, 0), "", {}, [], 0.0, env_steps=[{}], timing=RolloutTiming()).to_row()
)


@dataclass
class RolloutFailure:
    """A rollout that failed after every retry; goes to the failures sidecar, never aborts the job."""

    key: RolloutKey
    job_id: str
    error_class: str
    message: str
    attempts: int

    def to_row(self) -> Json:
        return {
            "task_index": self.key.task_index,
            "rollout_index": self.key.rollout_index,
            "job_id": self.job_id,
            "error_class": self.error_class,
            "message": self.message,
            "attempts": self.attempts,
        }

    @classmethod
    def from_row(cls, row: Json) -> RolloutFailure:
        return cls(
            key=RolloutKey(int(row["task_index"]), int(row["rollout_index"])),
            job_id=str(row.get("job_id", "")),
            error_class=str(row.get("error_class", "")),
            message=str(row.get("message", "")),
            attempts=int(row.get("attempts", 0)),
        )
