"""The domain records a job produces: rollouts, failures, token records. No grpc here.

A rollout's JSONL row is NeMo Gym's rollout row plus rollmesh's own fields (`Rollout.to_row`):
the input row's fields echoed; `response`, an OpenAI Responses object whose `output` holds the
episode's items (what NeMo Gym's tools and NeMo RL read); `_ng_task_index` / `_ng_rollout_index`,
the rollout's own key (whatever the input row carried); `reward` and `mask_sample`; and beside
them rollmesh's `task_index` / `rollout_index`, the chat view of the same turns (`chat_messages`,
OpenAI-style messages), `finish_reason` and the token record.

`Rollout.from_row` reads those rows, rows written before them (`response` was `{"output": [chat
messages], "finish_reason"}`) and NeMo Gym's own rollout rows (`ng_collect_rollouts` output: the
key in `_ng_*`, no token record, usage inside `response`): the one place either format is known.
A NeMo Gym row without a key (older recordings) is given one by `RowKeys` as it is read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from rollmesh.mesh import responses_items
from rollmesh.mesh.versions import VersionSpan
from rollmesh.scheduler.timing import RolloutTiming

Json = dict[str, Any]

# NeMo Gym's names for a rollout's key in its rows (nemo_gym/global_config.py).
NG_TASK_INDEX = "_ng_task_index"
NG_ROLLOUT_INDEX = "_ng_rollout_index"
#: The key marking the message that opens a later segment in a row's messages (an external agent
#: program that rewrote its history: program.py; tokens.py checks each segment's text on its own).
SEGMENT_KEY = "rollmesh_segment"


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
    #: The segment the turn belongs to: a turn whose prompt does not extend the ids before it (an
    #: external agent compacted its history, or ran a sub-agent) starts the next one, its prompt
    #: whole. Each segment is a sequence of its own; the built-in loop makes one.
    segment: int = 0
    #: Which policy version produced which generated ids (offsets in the record's token_ids,
    #: covering [output_start, output_end)), when more than one did: a CONTINUE weight update ran
    #: during the turn (partial rollouts). Empty: `policy_version` produced them all; else it is
    #: the first (oldest) span's.
    versions: tuple[VersionSpan, ...] = ()

    def to_json(self) -> Json:
        out: Json = dict(self.__dict__)  # the fields in order (a copy, not a comprehension: every row)
        del out["versions"]
        if self.versions:  # rows of single-version turns stay as they were
            out["versions"] = [v.to_json() for v in self.versions]
        return out

    @classmethod
    def from_json(cls, data: Json) -> TurnSpan:
        versions = tuple(VersionSpan.from_json(v) for v in data.get("versions") or ())
        return cls(**{k: v for k, v in data.items() if k != "versions"}, versions=versions)


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
            "turns": [t.to_json() for t in self.turns],
        }

    @classmethod
    def from_json(cls, data: Json) -> TokenRecord:
        recorded = data.get("logprobs_recorded")
        return cls(
            token_ids=list(data.get("token_ids", [])),
            loss_mask=list(data.get("loss_mask", [])),
            logprobs=[float(x) for x in data.get("logprobs", [])],
            turns=[TurnSpan.from_json(t) for t in data.get("turns", [])],
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
    model: str = ""  # the model the job asked for (the Responses object's `model`)
    #: An external agent program's run (scheduler/drivers/program.py: exit code, output tails, calls); empty,
    #: and absent from the row, for the built-in loop.
    agent_program: Json = field(default_factory=dict)

    def to_row(self) -> Json:
        """The JSONL output row: the input echoed, then what rollmesh adds (`env_steps` only when
        the environment took turns)."""
        row = {
            **self.task,
            "task_index": self.key.task_index,
            "rollout_index": self.key.rollout_index,
            NG_TASK_INDEX: self.key.task_index,
            NG_ROLLOUT_INDEX: self.key.rollout_index,
            "job_id": self.job_id,
            "response": self.response_object(),
            "chat_messages": self.messages,
            "finish_reason": self.finish_reason,
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
        if self.env_steps:
            row["env_steps"] = self.env_steps
        if self.timing is not None:
            row["timing"] = self.timing.to_json()
        if self.agent_program:
            row["agent_program"] = self.agent_program
        return row

    def response_object(self) -> Json:
        """The episode's turns as an OpenAI Responses object (`response` in the row)."""
        k = self.key
        return responses_items.response_object(
            responses_items.items_from_chat(self.messages),
            response_id=f"resp_{self.job_id}_{k.task_index}_{k.rollout_index}",
            model=self.model,
            finish_reason=self.finish_reason,
            input_tokens=self.prompt_tokens,
            output_tokens=self.completion_tokens,
        )

    @classmethod
    def from_row(cls, row: Json) -> Rollout:
        """Inverse of to_row (the task is every field rollmesh did not add); also reads rows written
        before `response` was a Responses object, and NeMo Gym's rollout rows (module docstring).
        ValueError (KeyError for a row with no key at all) when the row is none of them."""
        task = {k: v for k, v in row.items() if k not in _ADDED_FIELDS}
        response = row.get("response")
        legacy = isinstance(response, Mapping) and "finish_reason" in response and "object" not in response
        usage = row.get("usage") or _usage_of(response)
        if "reward" not in row and "task_index" not in row:  # a NeMo Gym row that is an input row
            raise ValueError("the row has no reward")
        return cls(
            key=_key_of(row),
            job_id=str(row.get("job_id", "")),
            task=task,
            messages=_messages_of(row, response, legacy),
            reward=_finite("reward", row.get("reward", 0.0)),
            reward_components={
                k: _finite(f"reward_components.{k}", v)
                for k, v in (row.get("reward_components") or {}).items()
            },
            extracted_answer=_text(row.get("extracted_answer")),
            verify_details=dict(row.get("verify_details") or {}),
            tokens=TokenRecord.from_json(row.get("tokens", {})),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            attempts=int(row.get("attempts", 1)),
            latency_s=float(row.get("latency_s", 0.0)),
            policy_version=str(row.get("policy_version", "")),
            seed=int(row.get("seed", 0)),
            finish_reason=_finish_of(row, response, legacy),
            env_steps=[dict(s) for s in row.get("env_steps", [])],
            masked=row_masked(row),
            timing=RolloutTiming.from_json(row["timing"]) if isinstance(row.get("timing"), dict) else None,
            model="" if legacy or not isinstance(response, Mapping) else _text(response.get("model")),
            agent_program=dict(row["agent_program"]) if isinstance(row.get("agent_program"), dict) else {},
        )


def row_masked(row: Json) -> bool:
    """A rollout row's `mask_sample`: the verifier masked its verdict (only a JSON true counts)."""
    return row.get("mask_sample") is True


def _key_of(row: Json) -> RolloutKey:
    """rollmesh's key, else NeMo Gym's (a row of ng_collect_rollouts); KeyError when neither."""
    for task, rollout in (("task_index", "rollout_index"), (NG_TASK_INDEX, NG_ROLLOUT_INDEX)):
        if task in row and rollout in row:
            return RolloutKey(int(row[task]), int(row[rollout]))
    raise KeyError(f"no task_index/rollout_index (nor NeMo Gym's {NG_TASK_INDEX}/{NG_ROLLOUT_INDEX})")


def _messages_of(row: Json, response: Any, legacy: bool) -> list[Json]:
    if "chat_messages" in row:
        return list(row["chat_messages"])
    if legacy:
        return list(response.get("output", []))
    if response is None:  # NeMo Gym records a rollout whose agent failed with no response
        return []
    if not isinstance(response, Mapping):
        raise ValueError(f"response is {type(response).__name__}, not a Responses object")
    return [m.to_openai() for m in responses_items.response_messages(response)]


def _finish_of(row: Json, response: Any, legacy: bool) -> str:
    """rollmesh's finish reason; for a NeMo Gym row, the Responses status's: completed "stop",
    cut at max_output_tokens "length", anything else "unknown"."""
    if "finish_reason" in row:
        return str(row["finish_reason"])
    if legacy:
        return str(response.get("finish_reason", ""))
    if not isinstance(response, Mapping):
        return "unknown"
    if response.get("status") == "completed":
        return "stop"
    details = response.get("incomplete_details")
    cut = isinstance(details, Mapping) and details.get("reason") == "max_output_tokens"
    return "length" if cut else "unknown"


def _usage_of(response: Any) -> Json:
    """A Responses object's usage in rollmesh's names (none: zeros)."""
    usage = response.get("usage") if isinstance(response, Mapping) else None
    if not isinstance(usage, Mapping):
        return {}
    return {
        "prompt_tokens": usage.get("input_tokens") or 0,
        "completion_tokens": usage.get("output_tokens") or 0,
    }


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


class RowKeys:
    """Keys for the rows of one file that carry none (NeMo Gym's recordings from before
    `_ng_task_index`): rows with the same `responses_create_params` are one task, numbered in the
    order tasks first appear, and its rollouts in file order. Rows with a key pass unchanged."""

    def __init__(self) -> None:
        self._tasks: dict[str, int] = {}
        self._rollouts: dict[int, int] = {}

    def fill(self, row: Json) -> Json:
        keyed = ("task_index" in row and "rollout_index" in row) or (
            NG_TASK_INDEX in row and NG_ROLLOUT_INDEX in row
        )
        if keyed or not isinstance(row.get("responses_create_params"), Mapping) or "response" not in row:
            return row  # keyed, or not a NeMo Gym rollout row: from_row says what it lacks
        identity = json.dumps(row.get("responses_create_params"), sort_keys=True, default=str)
        task = self._tasks.setdefault(identity, len(self._tasks))
        rollout = self._rollouts.get(task, 0)
        self._rollouts[task] = rollout + 1
        return {**row, NG_TASK_INDEX: task, NG_ROLLOUT_INDEX: rollout}


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
#: The fields a rollout row adds to its task (every other field of a row is the task's).
ADDED_FIELDS = _ADDED_FIELDS = frozenset(
    Rollout(
        RolloutKey(0, 0), "", {}, [], 0.0, env_steps=[{}], timing=RolloutTiming(), agent_program={"": 0}
    ).to_row()
)


@dataclass
class RolloutFailure:
    """A rollout that failed after every retry; goes to the failures sidecar, never aborts the job."""

    key: RolloutKey
    job_id: str
    error_class: str
    message: str
    attempts: int
    #: An agent program's failure: what a row keeps of its run (`Rollout.agent_program`'s shape).
    agent_program: Json = field(default_factory=dict)

    def to_row(self) -> Json:
        row: Json = {
            "task_index": self.key.task_index,
            "rollout_index": self.key.rollout_index,
            "job_id": self.job_id,
            "error_class": self.error_class,
            "message": self.message,
            "attempts": self.attempts,
        }
        if self.agent_program:
            row["agent_program"] = self.agent_program
        return row

    @classmethod
    def from_row(cls, row: Json) -> RolloutFailure:
        program = row.get("agent_program")
        return cls(
            key=RolloutKey(int(row["task_index"]), int(row["rollout_index"])),
            job_id=str(row.get("job_id", "")),
            error_class=str(row.get("error_class", "")),
            message=str(row.get("message", "")),
            attempts=int(row.get("attempts", 0)),
            agent_program=dict(program) if isinstance(program, dict) else {},
        )
