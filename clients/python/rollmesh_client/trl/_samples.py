"""One rollout in TRL's terms, and the rows a TRL dataset's prompts stand for (no TRL import here).

A GRPOTrainer `rollout_func` returns, per completion, `prompt_ids`, `completion_ids`, `logprobs`
and `env_mask`; a rollmesh token record holds every id of a (multi-turn) episode with its loss mask
and logprobs. The first turn's prompt is TRL's prompt; everything after it (the model's turns, tool
results, template glue) is TRL's completion, and the loss mask over it is `env_mask` (1 on ids the
policy generated).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollmesh_client._rollout import TrainerRollout

Json = dict[str, Any]
Messages = list[dict[str, str]]


@dataclass
class TrlSample:
    """One completion as TRL takes it. `reward` is None when there is no verdict to train on (the
    rollout failed, or the verifier masked it): TRL's reward functions return None for it, which
    TRL treats as unscorable (left out of its group's mean and std, advantage 0). `failure` names
    why ("" for a usable rollout)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float] | None
    reward: float | None
    policy_version: int | None
    finish_reason: str
    failure: str
    key: str


def trl_sample(r: TrainerRollout) -> TrlSample:
    """The token record of `r` split at its first generated id. A record TRL cannot take as one
    sequence (none at all: a model server that returns no ids; several segments: an agent program
    that rewrote its history) is a failed sample naming it, never a re-tokenized guess."""
    key = f"{r.job_id}/{r.task_index}/{r.rollout_index}"
    if not r.token_ids or not any(r.loss_mask):
        return failed_sample([], 0, "NO_TOKEN_RECORD: the model server returned no token ids", key)
    if len(r.segments) > 1:
        why = f"SEGMENTED_TOKEN_RECORD: {len(r.segments)} segments (an agent program rewrote its history)"
        return failed_sample(r.token_ids[: r.prompt_length], 0, why, key)
    start = r.prompt_length
    return TrlSample(
        prompt_ids=r.token_ids[:start],
        completion_ids=r.token_ids[start:],
        env_mask=[0] * (len(r.token_ids) - start) if r.masked else r.loss_mask[start:],  # as collate does
        logprobs=r.logprobs[start:] if r.logprobs is not None else None,
        reward=None if r.masked else r.reward,
        policy_version=r.version,
        finish_reason=r.finish_reason,
        failure="MASKED: the verifier could not judge it" if r.masked else "",
        key=key,
    )


def failed_sample(prompt_ids: Sequence[int], eos_id: int, failure: str, key: str) -> TrlSample:
    """A completion with nothing to train on: one id (TRL reads each completion's last id) under
    env_mask 0, so no loss, and no reward, so no advantage and no weight in its group."""
    return TrlSample(
        prompt_ids=list(prompt_ids),
        completion_ids=[eos_id],
        env_mask=[0],
        logprobs=[0.0],
        reward=None,
        policy_version=None,
        finish_reason="",
        failure=failure,
        key=key,
    )


# -- rows and prompts ---------------------------------------------------------------------------


def row_prompt(row: Mapping[str, Any]) -> Messages:
    """The chat messages a row asks (its `responses_create_params.input`, a string or a list of
    messages / Responses message items; or a TRL row's `prompt`), role and text only: what TRL shows
    and hands back to `rollout_func`, which finds the row again by them."""
    params = row.get("responses_create_params")
    raw: Any = params.get("input") if isinstance(params, Mapping) else row.get("prompt")
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    out: Messages = []
    if isinstance(params, Mapping) and params.get("instructions"):
        out.append({"role": "system", "content": str(params["instructions"])})
    for m in raw if isinstance(raw, list) else []:
        if isinstance(m, Mapping) and "role" in m:
            out.append({"role": str(m["role"]), "content": _text(m.get("content"))})
    return out


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return "" if content is None else str(content)


def prompt_key(prompt: Any) -> str:
    """The identity of a prompt as TRL hands it back (a list of message dicts, maybe with keys a
    `datasets` column added as None; or a plain string)."""
    if isinstance(prompt, str):
        return json.dumps([["user", prompt]])
    return json.dumps([[str(m.get("role")), _text(m.get("content"))] for m in prompt])


def as_rollmesh_row(row: Mapping[str, Any]) -> Json:
    """A rollmesh (NeMo Gym) row: as is when it has `responses_create_params`; a TRL row (`prompt`
    plus columns) becomes one whose input is the prompt, its other columns kept."""
    if "responses_create_params" in row:
        return dict(row)
    if "prompt" not in row:
        raise ValueError(f"a row needs responses_create_params or prompt; it has {sorted(row)}")
    rest = {k: v for k, v in row.items() if k != "prompt"}
    prompt = row["prompt"]
    given = (
        prompt if isinstance(prompt, str) else [{"role": m["role"], "content": m["content"]} for m in prompt]
    )
    return {"responses_create_params": {"input": given}, **rest}


class RowIndex:
    """The rows a TRL dataset's prompts stand for, found again by prompt."""

    def __init__(self) -> None:
        self._rows: dict[str, Json] = {}

    def add(self, rows: Iterable[Mapping[str, Any]]) -> list[Messages]:
        """Register `rows`; their prompts, in order. Two different rows with one prompt are refused:
        the trainer hands back only the prompt, so it could not tell which to run."""
        prompts = []
        for raw in rows:
            row = as_rollmesh_row(raw)
            prompt = row_prompt(row)
            key = prompt_key(prompt)
            seen = self._rows.setdefault(key, row)
            if seen != row:
                raise ValueError(
                    f"two rows ask the same prompt {prompt!r} (task ids {seen.get('task_id')!r} and "
                    f"{row.get('task_id')!r}): rollout_func gets only the prompt, so they must differ"
                )
            prompts.append(prompt)
        return prompts

    def row(self, prompt: Any) -> Json:
        key = prompt_key(prompt)
        if key not in self._rows:
            raise KeyError(
                f"prompt {prompt!r} is not a row of this rollout function: build the trainer's datasets "
                "with RollmeshRollouts.dataset(...) (or register rows with add_rows)"
            )
        return self._rows[key]
