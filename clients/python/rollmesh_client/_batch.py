"""Rollouts -> padded numpy arrays for a trainer (numpy only; convert to torch with `torch.from_numpy`).

`collate` gives the whole-sequence view (GRPO / PPO over multi-turn sequences: train where
`loss_mask` is 1); `verl_view` splits each sequence at the first turn's output into a
left-padded prompt and a right-padded response, the shape verl's DataProto uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field

import numpy as np
import numpy.typing as npt

from rollmesh_client._rollout import TrainerRollout

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float32]


@dataclass
class RolloutBatch:
    """B rollouts right-padded to T tokens.

    input_ids [B, T] int64 (pad_id after the end), attention_mask [B, T] int64 (1 on real ids),
    loss_mask [B, T] int64 (1 on generated ids), logprobs [B, T] float32 (the behaviour policy's,
    0 off generated ids; None when a row's job did not record them: see `collate`), rewards [B]
    float32, group_ids [B] int64 (one id per (job, task): the GRPO group), prompt_lengths [B] int64
    (ids before the first generated one), lengths [B] int64, truncated [B] bool, masked [B] bool
    (the verifier could not judge the row: its loss_mask is all 0 and its advantage 0, and it does
    not move its group's mean), token_versions [B, T] int64 (the policy version that generated
    each id, -1 off generated ids and where the label is not an integer: a turn a CONTINUE weight
    update split has two), policy_versions (each row's oldest label) / keys: per-row lists.
    """

    input_ids: IntArray
    attention_mask: IntArray
    loss_mask: IntArray
    logprobs: FloatArray | None
    rewards: FloatArray
    group_ids: IntArray
    prompt_lengths: IntArray
    lengths: IntArray
    truncated: npt.NDArray[np.bool_]
    keys: list[tuple[str, int, int]] = field(default_factory=list)
    policy_versions: list[str] = field(default_factory=list)
    masked: npt.NDArray[np.bool_] | None = None
    token_versions: IntArray | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def advantages(self, *, normalize_std: bool = True, eps: float = 1e-6) -> FloatArray:
        """GRPO advantages of the rows: see `grpo_advantages`."""
        return grpo_advantages(
            self.rewards, self.group_ids, normalize_std=normalize_std, eps=eps, masked=self.masked
        )


def collate(
    rollouts: Sequence[TrainerRollout],
    *,
    pad_id: int = 0,
    max_len: int | None = None,
    pad_to_multiple_of: int | None = None,
    require_logprobs: bool = False,
) -> RolloutBatch:
    """Pad `rollouts` into one `RolloutBatch`. Sequences longer than `max_len` are cut at the
    end (their `truncated` flag is set; the reward still applies to the kept ids). When a row has
    no logprobs (its job ran without `sampling.logprobs`), the batch's `logprobs` is None, or with
    `require_logprobs` (a trainer that uses them, as old-policy logprobs) a `ValueError`; so is a
    rollout whose token record has several segments (`TrainerRollout.segments`)."""
    if not rollouts:
        raise ValueError("collate needs at least one rollout")
    empty = next((r for r in rollouts if not r.token_ids), None)
    if empty is not None:  # a row of padding would still weigh in its group's advantages
        raise ValueError(
            f"rollout {empty.job_id}/{empty.task_index}/{empty.rollout_index} has no token record (its "
            "model server returned no token ids, e.g. an OpenAI URL that is not vLLM): it cannot be "
            "trained on"
        )
    segmented = next((r for r in rollouts if len(r.segments) > 1), None)
    if segmented is not None:  # one row would let the later segments attend to what they never saw
        s = segmented
        raise ValueError(
            f"rollout {s.job_id}/{s.task_index}/{s.rollout_index} has {len(s.segments)} token record "
            "segments (an external agent program rewrote its history): each is a sequence of its own "
            "(TrainerRollout.segments), which collate does not split"
        )
    unrecorded = next((r for r in rollouts if r.logprobs is None), None)
    if unrecorded is not None and require_logprobs:  # zeros would train as the old policy's logprobs
        u = unrecorded
        raise ValueError(
            f"rollout {u.job_id}/{u.task_index}/{u.rollout_index} has no logprobs: "
            "submit its job with sampling.logprobs=true (rollmesh run --logprobs)"
        )
    lengths = [len(r.token_ids) for r in rollouts]
    longest = max(lengths)
    keep = min(longest, max_len) if max_len is not None else longest  # ids kept per row at most
    width = max(keep, 1)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    b = len(rollouts)
    ids = np.full((b, width), pad_id, dtype=np.int64)
    attn = np.zeros((b, width), dtype=np.int64)
    mask = np.zeros((b, width), dtype=np.int64)
    lps = np.zeros((b, width), dtype=np.float32)
    versions = np.full((b, width), -1, dtype=np.int64)
    groups: dict[tuple[str, int], int] = {}
    group_ids = np.zeros(b, dtype=np.int64)
    for i, r in enumerate(rollouts):
        n = min(len(r.token_ids), keep)
        ids[i, :n] = r.token_ids[:n]
        attn[i, :n] = 1
        if not r.masked:  # a masked verdict is no measurement: nothing of the row is trained on
            mask[i, :n] = r.loss_mask[:n]
        if r.logprobs is not None:
            lps[i, :n] = r.logprobs[:n]
        versions[i, :n] = [-1 if v is None else v for v in r.token_versions[:n]]
        group_ids[i] = groups.setdefault((r.job_id, r.task_index), len(groups))
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        loss_mask=mask,
        logprobs=None if unrecorded is not None else lps,
        rewards=np.asarray([r.reward for r in rollouts], dtype=np.float32),
        group_ids=group_ids,
        prompt_lengths=np.asarray([min(r.prompt_length, keep) for r in rollouts], dtype=np.int64),
        lengths=np.asarray([min(n, keep) for n in lengths], dtype=np.int64),
        truncated=np.asarray([n > keep for n in lengths], dtype=np.bool_),
        keys=[(r.job_id, r.task_index, r.rollout_index) for r in rollouts],
        policy_versions=[r.policy_version for r in rollouts],
        masked=np.asarray([r.masked for r in rollouts], dtype=np.bool_),
        token_versions=versions,
    )


def grpo_advantages(
    rewards: npt.ArrayLike,
    group_ids: npt.ArrayLike,
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
    masked: npt.ArrayLike | None = None,
) -> FloatArray:
    """(reward - group mean) / (group std + eps), per group (std: population; a group of one -> 0).
    With `normalize_std=False`, only the mean is subtracted (Dr. GRPO). Rows `masked` (a verdict
    the verifier could not give) get 0 and are left out of their group's mean and std."""
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(group_ids, dtype=np.int64)
    measured = np.ones(r.shape, dtype=np.bool_) if masked is None else ~np.asarray(masked, dtype=np.bool_)
    adv = np.zeros_like(r)
    for gid in np.unique(g):
        sel = (g == gid) & measured
        if sel.sum() < 2:
            continue
        centered = r[sel] - r[sel].mean()
        adv[sel] = centered / (r[sel].std() + eps) if normalize_std else centered
    return adv.astype(np.float32)


def verl_view(batch: RolloutBatch, *, pad_id: int = 0) -> dict[str, npt.NDArray[np.generic]]:
    """verl's layout: `prompts` [B, P] left-padded, `responses` [B, R] right-padded (everything
    after the first turn's prompt, tool results included), `response_mask` [B, R] (1 only on
    generated ids), `input_ids` = prompts ++ responses, `attention_mask`, `position_ids`,
    `old_log_probs` [B, R] (left out when `batch.logprobs` is None), `token_level_scores` [B, R]
    (the reward on the last generated id), `response_versions` [B, R] (the policy version of each
    generated id, -1 elsewhere: `RolloutBatch.token_versions`; left out when the batch has none)."""
    b = len(batch)
    p_len = int(batch.prompt_lengths.max()) if b else 0
    r_len = max(int((batch.lengths - batch.prompt_lengths).max()), 1) if b else 1
    prompts = np.full((b, p_len), pad_id, dtype=np.int64)
    prompt_attn = np.zeros((b, p_len), dtype=np.int64)
    responses = np.full((b, r_len), pad_id, dtype=np.int64)
    resp_attn = np.zeros((b, r_len), dtype=np.int64)
    resp_mask = np.zeros((b, r_len), dtype=np.int64)
    old_lps = np.zeros((b, r_len), dtype=np.float32)
    scores = np.zeros((b, r_len), dtype=np.float32)
    versions = np.full((b, r_len), -1, dtype=np.int64)
    for i in range(b):
        p, n = int(batch.prompt_lengths[i]), int(batch.lengths[i])
        prompts[i, p_len - p :] = batch.input_ids[i, :p]
        prompt_attn[i, p_len - p :] = 1
        resp = n - p
        responses[i, :resp] = batch.input_ids[i, p:n]
        resp_attn[i, :resp] = 1
        resp_mask[i, :resp] = batch.loss_mask[i, p:n]
        if batch.logprobs is not None:
            old_lps[i, :resp] = batch.logprobs[i, p:n]
        if batch.token_versions is not None:
            versions[i, :resp] = batch.token_versions[i, p:n]
        gen = np.nonzero(resp_mask[i])[0]
        if gen.size:
            scores[i, gen[-1]] = batch.rewards[i]
    attention = np.concatenate([prompt_attn, resp_attn], axis=1)
    positions = np.clip(np.cumsum(attention, axis=1) - 1, 0, None)
    view = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": resp_mask,
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention,
        "position_ids": positions.astype(np.int64),
        "old_log_probs": old_lps,
        "token_level_scores": scores,
    }
    if batch.logprobs is None:
        del view["old_log_probs"]
    if batch.token_versions is not None:
        view["response_versions"] = versions
    return view
