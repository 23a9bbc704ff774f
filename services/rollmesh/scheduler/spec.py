"""The domain JobSpec (what to run) and its validation. No grpc here.

Zero values mean "default", as in the proto: `num_repeats = 0` takes the benchmark's value (else 1),
`concurrency = 0` is auto (AIMD), a zero retry field takes the RetryPolicy default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from rollmesh.scheduler import DEFAULT_OUTPUT_DIR
from rollmesh.scheduler.errors import InvalidJobSpec
from rollmesh.scheduler.errors import InvalidShard
from rollmesh_client._channel import check_address

Json = dict[str, Any]

SAMPLING_FIELDS = ("temperature", "top_p", "max_tokens", "stop", "seed", "logprobs", "top_k")
DEFAULT_MAX_STEPS = 8
# JobSpec.replace_groups: off, an unused task of the dataset, the same task with new seeds (refill.py).
NEXT_TASK, SAME_TASK = "next_task", "same_task"
REPLACE_MODES = ("", NEXT_TASK, SAME_TASK)


def _setting(default: Any, doc: str) -> Any:
    """A RetryPolicy field: its default and its meaning, which `rollmesh config` prints."""
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = _setting(3, "Attempts per rollout before it is recorded as a failure.")
    initial_backoff_s: float = _setting(0.5, "First wait between attempts (doubles each time, with jitter).")
    max_backoff_s: float = _setting(10.0, "Longest wait between attempts.")
    rollout_timeout_s: float = _setting(
        300.0,
        "Most one attempt may take (the adaptive deadline's ceiling); a gateway that answers none of "
        "the job's calls this long fails the job.",
    )
    unavailable_budget_s: float = _setting(
        60.0, "Seconds the gateway or verifier may stay unreachable before the job fails."
    )
    fail_fast_after: int = _setting(
        20, "The same non-retryable error on this many rollouts in a row fails the job."
    )
    attempt_deadline_multiplier: float = _setting(
        3.0, "A model call's deadline: this multiple of the recent p99 latency."
    )
    attempt_deadline_floor_s: float = _setting(
        1.0, "The least a model call is given once latency has been observed."
    )
    fixed_attempt_deadline: bool = _setting(
        False, "Every attempt gets rollout_timeout_s (no adaptive deadline)."
    )

    def with_defaults(self) -> RetryPolicy:
        """Zero fields replaced by the defaults (the proto's zero means unset)."""
        unset = [f.name for f in dataclasses.fields(self) if not getattr(self, f.name)]
        return dataclasses.replace(self, **{name: getattr(RetryPolicy(), name) for name in unset})


@dataclass(frozen=True)
class SinkConfig:
    kind: str = "jsonl"  # "jsonl" or "grpc"
    fsync_every: int = 0  # jsonl: rows per fsync batch (0 = the sink's default)
    address: str = ""  # grpc: the RolloutSink's host:port
    window: int = 0  # grpc: max unacknowledged rollouts (0 = the sink's default)
    ack_timeout_s: float = 0.0  # grpc: fail when nothing is acknowledged this long (0 = the default)


@dataclass(frozen=True)
class JobSpec:
    benchmark: str = ""
    dataset: str = ""
    environment: str = ""
    max_steps: int = 0
    system_prompt: str = ""
    # An external agent program run per rollout instead of the built-in loop (argv; program.py).
    agent_program: tuple[str, ...] = ()
    agent_program_env: dict[str, str] = field(default_factory=dict)
    # Run each task's reference solution instead of a model (scheduler/drivers/oracle.py), then verify.
    oracle: bool = False
    # How it runs: "command" ("": a process per rollout), "warm" or "server" (drivers/modes.py).
    agent_program_mode: str = ""
    model: str = ""
    # Only the sampling fields that were set (SAMPLING_FIELDS), so unset ones keep the model's defaults.
    sampling: Json = field(default_factory=dict)
    num_repeats: int = 0
    starting_seed: int = 0
    limit: int = 0
    shard_index: int = 0
    shard_count: int = 0
    concurrency: int = 0
    sink: SinkConfig = field(default_factory=SinkConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    output_dir: str = ""
    resume_job_id: str = ""
    validate_all: bool = False
    k_values: tuple[int, ...] = ()
    # Permanent failures the job tolerates and still SUCCEEDS: max(count, floor(fraction x total)).
    allowed_failures: int = 0
    allowed_failure_fraction: float = 0.0
    # Resume the newest unfinished job with the same rollouts under output_dir (else start a new one).
    resume_latest: bool = False
    # Keep batches full (refill.py): a task's group with a failed rollout is replaced by a fresh one,
    # "next_task" (an unused task of the dataset) or "same_task" (new seeds); "" replaces nothing.
    # At most max(max_replacements, floor(max_replacement_fraction x groups)) replacements; both 0:
    # as many as the job has groups.
    replace_groups: str = ""
    max_replacements: int = 0
    max_replacement_fraction: float = 0.0

    def to_json(self) -> Json:
        data = dataclasses.asdict(self)
        data["k_values"] = list(self.k_values)
        data["agent_program"] = list(self.agent_program)
        return data

    @classmethod
    def from_json(cls, data: Json) -> JobSpec:
        """A stored spec (spec.json); keys this version does not know (e.g. a retired field) are left out."""
        kw = _known(cls, data)
        kw["sink"] = SinkConfig(**_known(SinkConfig, data.get("sink", {})))
        kw["retry"] = RetryPolicy(**_known(RetryPolicy, data.get("retry", {})))
        kw["sampling"] = dict(data.get("sampling", {}))
        kw["k_values"] = tuple(int(k) for k in data.get("k_values", ()))
        kw["agent_program"] = tuple(str(a) for a in data.get("agent_program", ()))
        kw["agent_program_env"] = {str(k): str(v) for k, v in dict(data.get("agent_program_env", {})).items()}
        return cls(**kw)

    @property
    def effective_output_dir(self) -> str:
        return self.output_dir or DEFAULT_OUTPUT_DIR


def _known(cls: type[Any], data: object) -> Json:
    """The fields of `cls` in a stored object, each of its default's type: a job.json edited or
    corrupted raises ValueError naming the field instead of loading a spec nothing can convert."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__} is a {type(data).__name__}, not an object")
    kept = {f.name: (data[f.name], f.default) for f in dataclasses.fields(cls) if f.name in data}
    for name, (value, default) in kept.items():
        if isinstance(default, str | int | float) and not _same_kind(value, default):
            raise ValueError(f"{name} is {value!r:.60}, expected {type(default).__name__}")
    return {name: value for name, (value, _) in kept.items()}


def _same_kind(value: object, default: object) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default)
    if isinstance(default, int | float) and isinstance(value, int | float):
        return (isinstance(value, int) or isinstance(default, float)) and abs(value) < 2**63  # NaN: no
    return isinstance(value, type(default))


def validate(spec: JobSpec) -> None:
    """Reject a spec that cannot run, naming the field and what is allowed (before anything runs)."""
    numbers = {
        "num_repeats": spec.num_repeats,
        "limit": spec.limit,
        "concurrency": spec.concurrency,
        "agent.max_steps": spec.max_steps,
        **{f"retry.{f.name}": getattr(spec.retry, f.name) for f in dataclasses.fields(spec.retry)},
        "allowed_failures": spec.allowed_failures,
        "max_replacements": spec.max_replacements,
        "sink.fsync_every": spec.sink.fsync_every,
        "sink.window": spec.sink.window,
        "sink.grpc.ack_timeout_s": spec.sink.ack_timeout_s,
    }
    for name, value in numbers.items():
        # NaN passes `< 0`: a NaN budget or timeout never ran out (a hung service stalled the job).
        if not math.isfinite(value) or value < 0:
            raise InvalidJobSpec(
                f"{name} is {value}; it must be a number >= 0 (0 means the default)", metadata={"field": name}
            )
    if not 0.0 <= spec.allowed_failure_fraction <= 1.0:
        raise InvalidJobSpec(
            f"allowed_failure_fraction {spec.allowed_failure_fraction} must be in [0, 1]",
            metadata={"field": "allowed_failure_fraction"},
        )
    if not 0.0 <= spec.max_replacement_fraction <= 1e6:
        raise InvalidJobSpec(
            f"max_replacement_fraction {spec.max_replacement_fraction} must be a number >= 0",
            metadata={"field": "max_replacement_fraction"},
        )
    if spec.replace_groups not in REPLACE_MODES:
        raise InvalidJobSpec(
            f"replace_groups {spec.replace_groups!r} is not one of "
            + ", ".join(repr(m) for m in REPLACE_MODES),
            metadata={"field": "replace_groups"},
        )
    if any(k <= 0 for k in spec.k_values):
        raise InvalidJobSpec(
            f"k_values {list(spec.k_values)} must all be >= 1", metadata={"field": "k_values"}
        )
    if spec.resume_latest and spec.resume_job_id:
        raise InvalidJobSpec(
            "resume_latest and resume_job_id both ask to resume: give one (--resume or --job-id)",
            metadata={"field": "resume_latest"},
        )
    if not spec.benchmark and not spec.dataset and not spec.resume_job_id:
        raise InvalidJobSpec(
            "the job names no dataset: set `dataset` (an artifact name or a JSONL path) or `benchmark`",
            metadata={"field": "dataset"},
        )
    if spec.shard_count < 0 or spec.shard_index < 0:
        raise InvalidShard(
            f"shard {spec.shard_index}/{spec.shard_count} is negative; index must be in [0, count)",
            metadata={"field": "shard"},
        )
    if spec.shard_count > 1 and spec.shard_index >= spec.shard_count:
        raise InvalidShard(
            f"shard index {spec.shard_index} is not below shard count {spec.shard_count}; "
            f"use an index in [0, {spec.shard_count})",
            metadata={"field": "shard"},
        )
    if spec.shard_count <= 1 and spec.shard_index != 0:
        raise InvalidShard(
            f"shard index {spec.shard_index} needs a shard count above it (count is {spec.shard_count})",
            metadata={"field": "shard"},
        )
    if spec.sink.kind not in ("jsonl", "grpc"):
        raise InvalidJobSpec(
            f"sink kind {spec.sink.kind!r} is not 'jsonl' or 'grpc'", metadata={"field": "sink"}
        )
    if spec.sink.kind == "grpc" and not spec.sink.address:
        raise InvalidJobSpec(
            "a gRPC sink needs an address (host:port)", metadata={"field": "sink.grpc.address"}
        )
    if spec.sink.kind == "grpc":
        try:
            check_address(spec.sink.address)
        except ValueError as exc:
            raise InvalidJobSpec(
                f"sink.grpc.address {exc}", metadata={"field": "sink.grpc.address"}
            ) from None
    s = spec.sampling
    if "temperature" in s and not (math.isfinite(s["temperature"]) and s["temperature"] >= 0):
        raise InvalidJobSpec(
            f"sampling.temperature {s['temperature']} must be >= 0", metadata={"field": "sampling"}
        )
    if "top_p" in s and not 0 < s["top_p"] <= 1:
        raise InvalidJobSpec(f"sampling.top_p {s['top_p']} must be in (0, 1]", metadata={"field": "sampling"})
    if "max_tokens" in s and s["max_tokens"] <= 0:
        raise InvalidJobSpec(
            f"sampling.max_tokens {s['max_tokens']} must be > 0", metadata={"field": "sampling"}
        )
    if spec.resume_job_id and ("/" in spec.resume_job_id or spec.resume_job_id in (".", "..")):
        raise InvalidJobSpec(
            f"resume_job_id {spec.resume_job_id!r} is not a job id", metadata={"field": "resume_job_id"}
        )
