"""Where each rollout's time went: its phases, recorded in its row, and their percentiles over a job.

A row's `timing` (seconds):

- `queued_s`: waiting for a concurrency slot before the rollout started;
- `retried_s`: attempts that failed and the backoff after them, before the attempt the row is from;
- `seed_s`: opening the environment session (0 when none was opened);
- `model_s`, `first_token_s`: each model turn, from the call to its answer, and from the call's
  arrival at the gateway to the engine's first output (for a whole-output request, that is the
  whole output);
- `tool_s`: each tool call the verifier ran; `env_step_s`: each environment turn;
- `verify_s`: the verify call.

The phases of the attempt a row comes from are recorded (earlier attempts are `retried_s`). The
ports the agent loop calls through (engine.py's watched ports) record them into the rollout's
`RolloutTiming`, found through a context variable the engine sets per rollout, so the loop itself
carries no timing code. A sink write cannot be in the row it writes: its time is measured by the
engine (`Sink.write_times`) and reported only in the job's percentiles.

`percentiles` gives, per phase, n / mean / p50 / p95 / p99 / max (nearest rank: a value some sample
had), over rollouts (`rollout_s` is the row's `latency_s`), turns, tool calls or steps as the phase
counts them: what metrics.json's `timing` holds and `rollmesh timing` shows.
"""

from __future__ import annotations

import contextvars
import math
import random
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from typing import Any

Json = dict[str, Any]

# The phases of the job's percentiles, in the order a rollout goes through them.
PHASES = (
    "queued_s",
    "retried_s",
    "seed_s",
    "model_s",
    "first_token_s",
    "tool_s",
    "env_step_s",
    "verify_s",
    "sink_write_s",
    "rollout_s",
)
_LISTS = ("model_s", "first_token_s", "tool_s", "env_step_s")
#: `RolloutTiming.values()`: the fields in order, each list as a tuple.
TimingValues = tuple[
    float, float, float, tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...], float
]
_SCALARS = ("queued_s", "retried_s", "seed_s", "verify_s")


def _r(seconds: float) -> float:
    return round(seconds, 6)


def _finite(seconds: float) -> float:
    return seconds if math.isfinite(seconds) else 0.0


def _r_finite(seconds: float) -> float:
    """A scalar phase as `from_json` reads it back: rounded, and 0 when not finite."""
    return round(seconds, 6) if math.isfinite(seconds) else 0.0


@dataclass
class RolloutTiming:
    """One rollout's phases (seconds), as the row's `timing` holds them."""

    queued_s: float = 0.0
    retried_s: float = 0.0
    seed_s: float = 0.0
    model_s: list[float] = field(default_factory=list)
    first_token_s: list[float] = field(default_factory=list)
    tool_s: list[float] = field(default_factory=list)
    env_step_s: list[float] = field(default_factory=list)
    verify_s: float = 0.0

    # The methods that run for every rollout (new_attempt, add, to_json, rounded) name each phase
    # rather than loop over _SCALARS and _LISTS with getattr: they are on the scheduler's hot path.

    def new_attempt(self, retried_s: float) -> None:
        """An attempt starts: what earlier ones recorded is dropped, their time is `retried_s`."""
        self.retried_s = retried_s
        self.seed_s = self.verify_s = 0.0
        self.model_s.clear()
        self.first_token_s.clear()
        self.tool_s.clear()
        self.env_step_s.clear()

    def add(self, phase: str, seconds: float) -> None:
        """Record one call of `phase` (seed_s, tool_s, env_step_s or verify_s)."""
        if phase == "verify_s":
            self.verify_s += seconds
        elif phase == "seed_s":
            self.seed_s += seconds
        elif phase == "tool_s":
            self.tool_s.append(seconds)
        elif phase == "env_step_s":
            self.env_step_s.append(seconds)
        else:
            raise ValueError(f"not a phase add() records: {phase!r}")

    def rounded(self) -> RolloutTiming:
        """These phases as the row holds them (`to_json` rounds them): what reading it back gives."""
        return RolloutTiming.from_values(self.rounded_values())

    def rounded_values(self) -> TimingValues:
        """`rounded().values()`, without the RolloutTiming and its lists in between."""
        return (
            _r_finite(self.queued_s),
            _r_finite(self.retried_s),
            _r_finite(self.seed_s),
            tuple([round(v, 6) for v in self.model_s]),
            tuple([round(v, 6) for v in self.first_token_s]),
            tuple([round(v, 6) for v in self.tool_s]),
            tuple([round(v, 6) for v in self.env_step_s]),
            _r_finite(self.verify_s),
        )

    @staticmethod
    def rounded_values_of_json(data: Mapping[str, Any]) -> TimingValues:
        """`rounded_values()` of the timing whose `to_json()` is `data`, read off its already rounded
        values (rounding twice gives the same float) instead of rounding every phase again."""
        return (
            _finite(data["queued_s"]),
            _finite(data["retried_s"]),
            _finite(data["seed_s"]),
            tuple(data["model_s"]),
            tuple(data["first_token_s"]),
            tuple(data["tool_s"]),
            tuple(data["env_step_s"]),
            _finite(data["verify_s"]),
        )

    def values(self) -> TimingValues:
        """The phases as one tuple of plain values, in the fields' order (`from_values` reads it)."""
        return (
            self.queued_s,
            self.retried_s,
            self.seed_s,
            tuple(self.model_s),
            tuple(self.first_token_s),
            tuple(self.tool_s),
            tuple(self.env_step_s),
            self.verify_s,
        )

    @classmethod
    def from_values(cls, v: TimingValues) -> RolloutTiming:
        return cls(v[0], v[1], v[2], list(v[3]), list(v[4]), list(v[5]), list(v[6]), v[7])

    def to_json(self) -> Json:
        """Each phase rounded to 6 digits. Written out, for every row: a phase that took no time (0.0,
        the usual retried_s and seed_s) is kept as it is, which is what rounding gives (~0.2 us each);
        an empty list (most of them) is a new one, with no comprehension run (~0.15 us each)."""
        q, r, s, v = self.queued_s, self.retried_s, self.seed_s, self.verify_s
        model, first, tool, step = self.model_s, self.first_token_s, self.tool_s, self.env_step_s
        return {
            "queued_s": round(q, 6) if q else q,
            "retried_s": round(r, 6) if r else r,
            "seed_s": round(s, 6) if s else s,
            "verify_s": round(v, 6) if v else v,
            "model_s": [round(x, 6) for x in model] if model else [],
            "first_token_s": [round(x, 6) for x in first] if first else [],
            "tool_s": [round(x, 6) for x in tool] if tool else [],
            "env_step_s": [round(x, 6) for x in step] if step else [],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutTiming:
        """The row's `timing` (fields missing or of another type are left at 0 / empty)."""
        t = cls()
        for name in _SCALARS:
            value = data.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                setattr(t, name, float(value))
        for name in _LISTS:
            values = data.get(name)
            if isinstance(values, list):
                getattr(t, name).extend(
                    float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)
                )
        return t


# The rollout whose phases the watched ports record now (set by the engine for each rollout's task).
CURRENT: contextvars.ContextVar[RolloutTiming | None] = contextvars.ContextVar(
    "rollmesh_rollout_timing", default=None
)


def current() -> RolloutTiming | None:
    return CURRENT.get()


class Reservoir:
    """At most `size` samples of a stream of values, uniformly chosen (all of them while fewer), with
    a seeded generator: bounded memory for a job of any length, the same sample for the same stream."""

    def __init__(self, size: int = 100_000, seed: int = 0) -> None:
        self.size = size
        self.seen = 0
        self.values: list[float] = []
        self._rand = random.Random(seed)

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = self._rand.randrange(self.seen)
        if slot < self.size:
            self.values[slot] = value


def summary(values: Sequence[float], n: int | None = None) -> Json:
    """n, mean, p50, p95, p99 and max of `values` (nearest rank); `n` the count when `values` is a
    sample of more."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def rank(q: float) -> float:
        return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]

    return {
        "n": len(ordered) if n is None else n,
        "mean": _r(sum(ordered) / len(ordered)),
        "p50": _r(rank(0.50)),
        "p95": _r(rank(0.95)),
        "p99": _r(rank(0.99)),
        "max": _r(ordered[-1]),
    }


def percentiles(timings: Iterable[tuple[RolloutTiming, float]], sink_writes: Reservoir | None = None) -> Json:
    """Per phase, `summary` over every (timing, latency_s) given (rows without a timing give none:
    rows written before rollmesh recorded phases); `sink_write_s` from `sink_writes` (this run's
    writes) when given. Phases no rollout went through are left out."""
    samples: dict[str, list[float]] = {name: [] for name in PHASES}
    for t, latency_s in timings:
        for name in _SCALARS:
            samples[name].append(getattr(t, name))
        for name in _LISTS:
            samples[name].extend(getattr(t, name))
        samples["rollout_s"].append(latency_s)
    out: Json = {}
    for name in PHASES:
        if name == "sink_write_s":
            if sink_writes is not None and sink_writes.values:
                out[name] = summary(sink_writes.values, n=sink_writes.seen)
        elif samples[name] and (name not in ("seed_s", "retried_s") or any(samples[name])):
            out[name] = summary(samples[name])
    return out
