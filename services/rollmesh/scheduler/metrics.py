"""Job metrics: pure functions over rollouts and failures. No grpc, no I/O.

`compute(rollouts, failures, k_values=...)` returns a `Metrics` (typed, proto-independent; the
scheduler converts it to `JobMetrics`); `Metrics.to_json()` is the JSON-ready dict written to
`metrics.json`. Rollouts may be given whole or as
`Scored`, the few fields metrics read (what the scheduler keeps per rollout when its sink cannot
be read back, e.g. a trainer's gRPC sink: ~10x smaller than the rollout without its tokens).

Definitions (every one deterministic, independent of arrival order and sharding):

- Rollouts are keyed by `(task_index, rollout_index)`; a key seen twice counts once (the first
  occurrence wins). A task's rollouts are ordered by `rollout_index`.
- A rollout is *correct* when `reward >= threshold` (default 1.0, i.e. full credit).
- pass@k, unbiased (Chen et al. 2021): per task with n rollouts of which c are correct,
  `1 - C(n-c, k) / C(n, k)`, then averaged over tasks. Tasks with n < k (some repeats failed) are
  left out of pass@k for that k; `num_tasks_at_k[k]` says how many tasks each k covers.
- maj@k: per task with n >= k, the first k rollouts (by rollout_index) vote with their extracted
  answers; empty answers abstain. The answer with most votes wins; a tie goes to the tied answer
  that appears first (lowest rollout_index). The task scores 1 when the earliest rollout among
  those k with the winning answer is correct, else 0 (also 0 when every answer is empty).
  Averaged over tasks with n >= k.
- pass_at_1_avg: per task, the fraction of its rollouts that are correct, averaged over tasks.
  `pass_at_1_avg_of_k[k]` does the same over each task's first k rollouts only.
- mean / std / stderr of reward over every rollout: std is the sample std (n-1; 0 when n < 2),
  stderr = std / sqrt(n). The per-task profile uses the same std.
- Masked rollouts (the verifier could not judge them: `Rollout.masked`, NeMo Gym's `mask_sample`)
  count in num_rollouts, num_tasks and the token figures and in `num_masked`, and in no reward
  figure: mean/std/stderr, pass@k, maj@k, pass@1 and the per-task profile are over the measured
  rollouts only (a task whose rollouts are all masked is in none of them). Their reward is not a 0.
  `measured_reward` is that rule, one place: the live progress (engine.Progress, the sinks' counts,
  store.count_on_disk) uses it too, so the running mean reward agrees with metrics.json's.
- Failures: a failure whose key also has a rollout (a resumed job retried it) is not counted.
- timing: per phase of the rollouts (timing.py: queued, retried, seed, each model turn and its time
  to first token, each tool call and environment step, verify, the run's sink writes, the whole
  rollout), n / mean / p50 / p95 / p99 / max seconds over the rows that recorded them.
- health: deterministic findings about each rollout's conversation, apart from its reward (health.py:
  empty turns, cut at max tokens, unanswered tool calls, repeated output, unparsed tool-call text;
  near the context limit is not checked here), counted, as a share of the rollouts, and by key.
- Default k values: powers of two up to n, plus n, where n = `num_repeats` when given, else the
  largest number of rollouts any task has.
"""

from __future__ import annotations

import collections
import marshal
import math
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from rollmesh.scheduler import health
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.timing import Reservoir
from rollmesh.scheduler.timing import RolloutTiming
from rollmesh.scheduler.timing import TimingValues
from rollmesh.scheduler.timing import percentiles

DEFAULT_THRESHOLD = 1.0
#: `Scored.pack()`'s bytes (nested tuples of plain values, marshalled).
Packed = bytes
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Scored:
    """What metrics read of one rollout."""

    key: RolloutKey
    job_id: str
    task_id: str
    reward: float
    extracted_answer: str
    prompt_tokens: int
    completion_tokens: int
    record_tokens: int  # len(tokens.token_ids)
    masked: bool = False
    latency_s: float = 0.0
    timing: RolloutTiming | None = None
    health: dict[str, int] = field(default_factory=dict)  # health.py's findings (context length unknown)

    @classmethod
    def of(cls, r: Rollout, *, timing: RolloutTiming | None = None) -> Scored:
        """What metrics read of `r` (`timing` in place of `r.timing` when given)."""
        return cls(
            key=r.key,
            job_id=r.job_id,
            task_id=task_id_of(r.task, r.key.task_index),
            reward=r.reward,
            extracted_answer=r.extracted_answer,
            prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens,
            record_tokens=len(r.tokens.token_ids),
            masked=r.masked,
            latency_s=r.latency_s,
            timing=r.timing if timing is None else timing,
            health=_findings(r),
        )

    @classmethod
    def stored(cls, r: Rollout) -> Scored:
        """What `Scored.of(Rollout.from_row(r.to_row()))` reads back of `r`'s row once stored,
        without parsing the row: `r`'s fields, its timing as the row rounds it."""
        return cls.of(r, timing=r.timing.rounded() if r.timing is not None else None)

    @staticmethod
    def stored_packed(r: Rollout, row_timing: Json | None = None) -> Packed:
        """`Scored.stored(r).pack()` built at once, with no Scored or rounded timing in between: the
        JSONL sink keeps one for every row it writes. `row_timing`: `r.timing.to_json()` when the
        caller has it (the row's `timing`), read instead of rounding the phases again."""
        k = r.key
        if r.timing is None:
            timing = None
        elif row_timing is None:
            timing = r.timing.rounded_values()
        else:
            timing = RolloutTiming.rounded_values_of_json(row_timing)
        return _pack(
            (
                k.task_index,
                k.rollout_index,
                r.job_id,
                task_id_of(r.task, k.task_index),
                r.reward,
                r.extracted_answer,
            ),
            (r.prompt_tokens, r.completion_tokens, len(r.tokens.token_ids), r.masked, r.latency_s),
            timing,
            _findings(r),
        )

    def pack(self) -> Packed:
        """This summary as bytes, for a sink that holds one per row for a job's whole run: bytes are
        no container the collector tracks, where the dataclass, its timing's lists and its key (or
        tuples of them, until a collection has seen them) would add to every young collection; in
        the JSONL sink that cost more than reading the rows back at close."""
        k, t = self.key, self.timing
        return _pack(
            (k.task_index, k.rollout_index, self.job_id, self.task_id, self.reward, self.extracted_answer),
            (self.prompt_tokens, self.completion_tokens, self.record_tokens, self.masked, self.latency_s),
            None if t is None else t.values(),
            self.health,
        )

    @classmethod
    def unpack(cls, packed: Packed) -> Scored:
        """The inverse of `pack`."""
        (task_index, rollout_index, job_id, task_id, reward, answer), numbers, timing, found = marshal.loads(
            packed
        )
        prompt_tokens, completion_tokens, record_tokens, masked, latency_s = numbers
        return cls(
            RolloutKey(task_index, rollout_index),
            job_id,
            task_id,
            reward,
            answer,
            prompt_tokens,
            completion_tokens,
            record_tokens,
            masked,
            latency_s,
            None if timing is None else RolloutTiming.from_values(timing),
            dict(found),
        )


def _findings(r: Rollout) -> dict[str, int]:
    return health.findings(r.messages, r.finish_reason, [t.output_end for t in r.tokens.turns])


def _pack(
    ids: tuple[Any, ...], numbers: tuple[Any, ...], timing: TimingValues | None, found: dict[str, int]
) -> Packed:
    """`Scored.pack()`'s bytes: plain values only (marshal keeps their types; read in this process)."""
    # Version 2: no back-references (from 3 on marshal looks every object up in a table of those it
    # wrote, half its time for a tuple this size); loads reads every version.
    return marshal.dumps((ids, numbers, timing, tuple(found.items())), 2)


def measured_reward(r: Rollout | Scored) -> float | None:
    """The reward of `r` as a measurement, or None when its verdict is masked (no reward figure
    counts it: not a 0)."""
    return None if r.masked else r.reward


@dataclass(frozen=True)
class TaskProfile:
    task_index: int
    task_id: str
    num_rollouts: int
    num_correct: int
    mean_reward: float
    std_reward: float
    min_reward: float
    max_reward: float

    def to_json(self) -> Json:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GroupProfile:
    """The metrics of one group of tasks (`group_of` their task_id: a reasoning-gym generator)."""

    group: str
    num_tasks: int
    num_rollouts: int
    num_correct: int
    mean_reward: float
    pass_at_1_avg: float
    pass_at_k: dict[int, float]

    def to_json(self) -> Json:
        return {**self.__dict__, "pass_at_k": {str(k): v for k, v in self.pass_at_k.items()}}


@dataclass
class Metrics:
    job_id: str = ""
    num_rollouts: int = 0
    num_tasks: int = 0
    num_failures: int = 0
    num_duplicates: int = 0
    threshold: float = DEFAULT_THRESHOLD
    k_values: list[int] = field(default_factory=list)
    mean_reward: float = 0.0
    std_reward: float = 0.0
    stderr_reward: float = 0.0
    pass_at_k: dict[int, float] = field(default_factory=dict)
    maj_at_k: dict[int, float] = field(default_factory=dict)
    num_tasks_at_k: dict[int, int] = field(default_factory=dict)
    pass_at_1_avg: float = 0.0
    pass_at_1_avg_of_k: dict[int, float] = field(default_factory=dict)
    mean_prompt_tokens: float = 0.0
    mean_completion_tokens: float = 0.0
    total_prompt_tokens: int = 0
    total_completion_tokens: int = 0
    max_completion_tokens: int = 0
    mean_record_tokens: float = 0.0
    failures_by_class: dict[str, int] = field(default_factory=dict)
    tasks: list[TaskProfile] = field(default_factory=list)
    num_masked: int = 0
    #: Per phase of the rollouts (timing.py): n, mean, p50, p95, p99, max in seconds.
    timing: dict[str, Json] = field(default_factory=dict)
    #: Rollout health findings (health.py): counts, shares, keys, what was not checked.
    health: Json = field(default_factory=dict)

    def to_json(self) -> Json:
        """JSON-ready: int map keys become strings ("1", "2", ...)."""
        data: Json = {}
        for name, value in self.__dict__.items():
            if name == "tasks":
                data[name] = [t.to_json() for t in value]
            elif isinstance(value, dict) and name != "failures_by_class":
                data[name] = {str(k): v for k, v in value.items()}
            else:
                data[name] = value
        return data

    @classmethod
    def from_json(cls, data: Json) -> Metrics:
        kw: dict[str, Any] = dict(data)
        for name in ("pass_at_k", "maj_at_k", "num_tasks_at_k", "pass_at_1_avg_of_k"):
            kw[name] = {int(k): v for k, v in data.get(name, {}).items()}
        kw["tasks"] = [TaskProfile(**t) for t in data.get("tasks", [])]
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in kw.items() if k in known})


def default_k_values(n: int) -> list[int]:
    """Powers of two up to n, plus n: 1, 2, 4, ..., n."""
    ks = [2**i for i in range(n.bit_length())] if n >= 1 else []
    return ks if not ks or ks[-1] == n else [*ks, n]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task: 1 - C(n-c, k) / C(n, k). Requires 1 <= k <= n."""
    if k < 1 or k > n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i), numerically stable.
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def majority_correct(rollouts: Sequence[Scored], threshold: float = DEFAULT_THRESHOLD) -> float:
    """maj@k of one task over `rollouts` (already the first k, in rollout_index order)."""
    votes: dict[str, int] = {}
    first: dict[str, Scored] = {}
    for r in rollouts:
        ans = r.extracted_answer.strip()
        if not ans:
            continue
        votes[ans] = votes.get(ans, 0) + 1
        first.setdefault(ans, r)
    if not votes:
        return 0.0
    best = max(votes.values())
    # Dicts keep insertion order, so the first tied answer is the one that appeared first.
    winner = next(a for a, v in votes.items() if v == best)
    return 1.0 if _correct(first[winner], threshold) else 0.0


def task_id_of(task: Json, task_index: int) -> str:
    """The task's own id when the row has one (`task_id`, `id`, `instance_id`), else its index."""
    for name in ("task_id", "id", "instance_id"):
        value = task.get(name)
        if value is not None and value != "":
            return str(value)
    return str(task_index)


def dedupe(rollouts: Iterable[Rollout | Scored]) -> tuple[dict[RolloutKey, Scored], int]:
    """Rollouts by key, the first occurrence winning; and how many duplicates were dropped."""
    by_key: dict[RolloutKey, Scored] = {}
    dups = 0
    for item in rollouts:
        r = item if isinstance(item, Scored) else Scored.of(item)
        if r.key in by_key:
            dups += 1
        else:
            by_key[r.key] = r
    return by_key, dups


def compute(
    rollouts: Iterable[Rollout | Scored],
    failures: Iterable[RolloutFailure] = (),
    *,
    k_values: Sequence[int] | None = None,
    num_repeats: int | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    job_id: str = "",
    sink_writes: Reservoir | None = None,
) -> Metrics:
    """`sink_writes`: the sink write times of the run (timing.py), for the timing figures."""
    by_key, dups = dedupe(rollouts)
    by_task: dict[int, list[Scored]] = {}  # the measured rollouts (masked ones left out)
    for key in sorted(by_key):
        if measured_reward(by_key[key]) is not None:
            by_task.setdefault(key.task_index, []).append(by_key[key])

    failed: dict[RolloutKey, RolloutFailure] = {}
    for f in failures:
        if f.key not in by_key:
            failed.setdefault(f.key, f)
    failures_by_class = collections.Counter(f.error_class for f in failed.values())

    m = Metrics(
        job_id=job_id or next((r.job_id for r in by_key.values()), ""),
        num_rollouts=len(by_key),
        num_tasks=len({k.task_index for k in by_key}),
        num_failures=len(failed),
        num_masked=sum(r.masked for r in by_key.values()),
        num_duplicates=dups,
        threshold=threshold,
        failures_by_class=dict(sorted(failures_by_class.items())),
    )
    m.timing = percentiles(((r.timing, r.latency_s) for r in by_key.values() if r.timing), sink_writes)
    m.health = health.report((k.as_str(), r.health) for k, r in sorted(by_key.items())).to_json()
    if not by_key:
        return m
    _token_figures(m, list(by_key.values()))
    if not by_task:
        return m

    n_max = num_repeats or max(len(v) for v in by_task.values())
    ks = sorted({int(k) for k in k_values if k >= 1}) if k_values else default_k_values(n_max)
    m.k_values = ks

    rewards = [r.reward for task in by_task.values() for r in task]
    m.mean_reward, m.std_reward = _mean_std(rewards)
    m.stderr_reward = m.std_reward / math.sqrt(len(rewards))

    for k in ks:
        eligible = [t for t in by_task.values() if len(t) >= k]
        if not eligible:
            continue
        m.num_tasks_at_k[k] = len(eligible)
        m.pass_at_k[k] = _avg(pass_at_k(len(t), _num_correct(t, threshold), k) for t in eligible)
        m.maj_at_k[k] = _avg(majority_correct(t[:k], threshold) for t in eligible)
        m.pass_at_1_avg_of_k[k] = _avg(_num_correct(t[:k], threshold) / k for t in eligible)
    m.pass_at_1_avg = _avg(_num_correct(t, threshold) / len(t) for t in by_task.values())
    m.tasks = profile(by_task, threshold)
    return m


def _token_figures(m: Metrics, rollouts: Sequence[Scored]) -> None:
    prompt = [r.prompt_tokens for r in rollouts]
    completion = [r.completion_tokens for r in rollouts]
    m.total_prompt_tokens = sum(prompt)
    m.total_completion_tokens = sum(completion)
    m.mean_prompt_tokens = m.total_prompt_tokens / len(prompt)
    m.mean_completion_tokens = m.total_completion_tokens / len(completion)
    m.max_completion_tokens = max(completion)
    m.mean_record_tokens = _avg(float(r.record_tokens) for r in rollouts)


def profile(by_task: dict[int, list[Scored]], threshold: float = DEFAULT_THRESHOLD) -> list[TaskProfile]:
    """The per-task reward profile, ordered by task_index."""
    out: list[TaskProfile] = []
    for task_index in sorted(by_task):
        rs = by_task[task_index]
        rewards = [r.reward for r in rs]
        mean, std = _mean_std(rewards)
        out.append(
            TaskProfile(
                task_index=task_index,
                task_id=rs[0].task_id,
                num_rollouts=len(rs),
                num_correct=_num_correct(rs, threshold),
                mean_reward=mean,
                std_reward=std,
                min_reward=min(rewards),
                max_reward=max(rewards),
            )
        )
    return out


def task_profile(
    rollouts: Iterable[Rollout | Scored], threshold: float = DEFAULT_THRESHOLD
) -> list[TaskProfile]:
    """The per-task reward profile of `compute`'s metrics (`Metrics.tasks`)."""
    return compute(rollouts, threshold=threshold).tasks


def group_of(task_id: str) -> str:
    """A task's group: its task_id up to the last '/' (reasoning-gym rows are GENERATOR/INDEX), or
    the whole task_id when it has none."""
    return task_id.rpartition("/")[0] or task_id


def group_profile(
    rollouts: Iterable[Rollout | Scored],
    threshold: float = DEFAULT_THRESHOLD,
    k_values: Sequence[int] | None = None,
) -> list[GroupProfile]:
    """`compute`'s metrics per group of tasks (`group_of`), ordered by group name; pass@k over the
    k values every group's tasks reach unless `k_values` is given."""
    by_key, _ = dedupe(rollouts)
    groups: dict[str, list[Scored]] = {}
    for r in by_key.values():
        groups.setdefault(group_of(r.task_id), []).append(r)
    out: list[GroupProfile] = []
    for name in sorted(groups):
        m = compute(groups[name], k_values=k_values, threshold=threshold)
        out.append(
            GroupProfile(
                group=name,
                num_tasks=m.num_tasks,
                num_rollouts=m.num_rollouts,
                num_correct=sum(t.num_correct for t in m.tasks),
                mean_reward=m.mean_reward,
                pass_at_1_avg=m.pass_at_1_avg,
                pass_at_k=dict(m.pass_at_k),
            )
        )
    return out


def _correct(r: Scored, threshold: float) -> bool:
    return r.reward >= threshold - _EPS


def _num_correct(rs: Sequence[Scored], threshold: float) -> int:
    return sum(1 for r in rs if _correct(r, threshold))


def _avg(values: Iterable[float]) -> float:
    vs = list(values)
    return math.fsum(vs) / len(vs) if vs else 0.0


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)
