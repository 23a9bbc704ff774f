"""`TrainerRollout`: one rollout as a trainer sees it (what `SinkServer` delivers and `collate`
batches), built from the `rollmesh.v1.Rollout` the scheduler sent; re-exported by trainer.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2

Key = tuple[int, int]


def parse_version(label: str) -> int | None:
    """A policy version label as an int ("7" -> 7); None when empty or not an integer."""
    try:
        return int(label.strip())
    except (ValueError, AttributeError):
        return None


@dataclass
class TrainerRollout:
    """One rollout as the trainer sees it. `raw` is the full `rollmesh.v1.Rollout`. `logprobs` is
    None when the job did not record them (`sampling.logprobs` off: the record holds zeros).
    `masked`: the verifier could not judge it (NeMo Gym's `mask_sample`): `reward` is no
    measurement; `collate` gives it no loss and no weight in its group's advantages."""

    job_id: str
    task_index: int
    rollout_index: int
    reward: float
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    prompt_length: int
    policy_version: str
    version: int | None
    extracted_answer: str
    finish_reason: str
    raw: scheduler_pb2.Rollout
    staleness: int | None = None
    stale: bool = False
    masked: bool = False

    @property
    def key(self) -> Key:
        return (self.task_index, self.rollout_index)

    @property
    def segments(self) -> list[tuple[int, int]]:
        """[start, end) of each segment of the token record: one for the built-in loop; an external
        agent program that rewrote its history (compacted it, ran a sub-agent) has several, each a
        sequence of its own (its first ids are its whole prompt), never to be read as one."""
        turns = self.raw.tokens.turns
        starts = [t.prompt_start for i, t in enumerate(turns) if i == 0 or t.segment != turns[i - 1].segment]
        ends = [*starts[1:], len(self.token_ids)]
        return list(zip(starts, ends, strict=True)) if starts else [(0, len(self.token_ids))]

    @property
    def token_versions(self) -> list[int | None]:
        """Per id of `token_ids`: the policy version (integer label) that generated it; None on ids
        the policy did not generate and where the label is not an integer. A turn a CONTINUE weight
        update split (partial rollouts) has ids of two versions; a staleness bound counts the oldest."""
        out: list[int | None] = [None] * len(self.token_ids)
        for t in self.raw.tokens.turns:
            spans = [(s.start, s.end, s.policy_version) for s in t.versions] or [
                (t.output_start, t.output_end, t.policy_version)
            ]
            for start, end, label in spans:
                version = parse_version(label)
                out[start:end] = [version] * (end - start)
        return out

    @property
    def task(self) -> dict[str, Any]:
        data = json.loads(self.raw.task_json) if self.raw.task_json else {}
        return data if isinstance(data, dict) else {}

    @property
    def timing(self) -> dict[str, Any]:
        """Where the rollout's time went (seconds per phase, as a row's `timing`); {} when the
        scheduler did not record it."""
        data = json.loads(self.raw.timing_json) if self.raw.timing_json else {}
        return data if isinstance(data, dict) else {}

    @classmethod
    def from_pb(cls, msg: scheduler_pb2.Rollout) -> TrainerRollout:
        tokens = msg.tokens
        labels = [t.policy_version for t in tokens.turns] + [
            s.policy_version for t in tokens.turns for s in t.versions
        ]
        versions = [v for v in (parse_version(label) for label in labels) if v is not None]
        version = min(versions) if versions else parse_version(msg.policy_version)
        return cls(
            job_id=msg.job_id,
            task_index=int(msg.key.task_index),
            rollout_index=int(msg.key.rollout_index),
            reward=float(msg.reward),
            token_ids=list(tokens.token_ids),
            loss_mask=list(tokens.loss_mask),
            logprobs=list(tokens.logprobs) if _logprobs_recorded(tokens) else None,
            prompt_length=int(tokens.turns[0].output_start) if tokens.turns else len(tokens.token_ids),
            policy_version=msg.policy_version,
            version=version,
            extracted_answer=msg.extracted_answer,
            finish_reason=msg.finish_reason,
            raw=msg,
            masked=msg.masked,
        )


def _logprobs_recorded(tokens: common_pb2.TokenRecord) -> bool:
    """The record's flag; unset (a scheduler from before it): whether a generated id has a non-zero one."""
    if tokens.HasField("logprobs_recorded"):
        return tokens.logprobs_recorded
    return any(lp != 0.0 for lp, m in zip(tokens.logprobs, tokens.loss_mask, strict=False) if m)
