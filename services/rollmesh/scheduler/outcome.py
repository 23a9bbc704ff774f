"""What a job's end means: its final state from its permanent failures, the failure summary, and
the fail-fast rule. Pure (no grpc, no I/O), so the engine, the manager and tests share one truth.

- A run that dispatched every key ends SUCCEEDED when its permanent failures (rollouts written to
  the failures sidecar in this run; a resumed job retries earlier ones) are within the bound,
  `max(allowed_failures, floor(allowed_failure_fraction * total))` (default 0: none allowed).
  Above the bound it ends COMPLETED_WITH_FAILURES, or FAILED when no rollout of the job succeeded
  (then there is nothing to train or evaluate on). The error names the top failure classes.
- `FailureTally` counts failures per class and keeps the first message of each as its example;
  `summary()` lists classes most frequent first (ties by name), at most `TOP_CLASSES`.
- `FailFast`: N rollouts in a row (in completion order) failing with the same non-retryable class
  (UNAUTHENTICATED, PERMISSION_DENIED, MODEL_NOT_FOUND, an environment that cannot load, ...) means
  every further rollout would fail the same way: the job fails at once with that reason. Any
  success, or a failure of another class, starts the count again.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

SUCCEEDED = "SUCCEEDED"
COMPLETED_WITH_FAILURES = "COMPLETED_WITH_FAILURES"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
INTERRUPTED = "INTERRUPTED"  # its scheduler stopped while it ran (found in job.json after a restart)
FINAL_STATES = frozenset({SUCCEEDED, COMPLETED_WITH_FAILURES, FAILED, CANCELLED, INTERRUPTED})

TOP_CLASSES = 5
EXAMPLE_CHARS = 300  # an example message is cut to this many characters


@dataclass(frozen=True)
class FailureClassSummary:
    error_class: str
    count: int
    example_message: str

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> FailureClassSummary:
        return cls(
            str(data.get("error_class", "")),
            int(str(data.get("count", 0))),
            str(data.get("example_message", "")),
        )


class FailureTally:
    """Failures per class, with the first message of each class as its example."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._examples: dict[str, str] = {}

    def add(self, error_class: str, message: str) -> None:
        self._counts[error_class] = self._counts.get(error_class, 0) + 1
        short = message if len(message) <= EXAMPLE_CHARS else message[: EXAMPLE_CHARS - 1] + "…"
        self._examples.setdefault(error_class, short)

    def summary(self, top: int = TOP_CLASSES) -> list[FailureClassSummary]:
        ranked = sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        return [FailureClassSummary(c, n, self._examples[c]) for c, n in ranked]


def failure_bound(total: int, allowed_failures: int, allowed_fraction: float) -> int:
    """The most permanent failures a job of `total` rollouts may have and still succeed."""
    return max(allowed_failures, math.floor(allowed_fraction * total + 1e-9))


def final_state(
    *,
    total: int,
    succeeded: int,
    failed: int,
    allowed_failures: int,
    allowed_fraction: float,
    tally: FailureTally,
) -> tuple[str, str]:
    """(state, error) of a run that dispatched every key; `succeeded`/`failed` count the whole job
    (rollouts already written before a resume count as succeeded)."""
    bound = failure_bound(total, allowed_failures, allowed_fraction)
    if failed <= bound:
        return SUCCEEDED, ""
    # One line naming the classes: `UNAUTHENTICATED x40 (e.g. "bad token"); ...`.
    why = "; ".join(f'{s.error_class} x{s.count} (e.g. "{s.example_message}")' for s in tally.summary())
    if succeeded == 0:
        return FAILED, f"every rollout failed ({failed} of {total}): {why}"
    return (
        COMPLETED_WITH_FAILURES,
        f"{failed} of {total} rollouts failed permanently (allowed: {bound}; raise it with "
        f"--allowed-failures): {why}",
    )


class FailFast:
    """Counts rollouts in a row that failed with one non-retryable class."""

    def __init__(self, after: int) -> None:
        self.after = after
        self._class = ""
        self._run = 0

    def success(self) -> None:
        self._class, self._run = "", 0

    def failure(self, error_class: str, retryable: bool) -> bool:
        """Record a permanent failure; True when the job should stop now."""
        if retryable:  # retries ran out on a transient error: not evidence that every rollout fails
            self._class, self._run = "", 0
            return False
        if error_class == self._class:
            self._run += 1
        else:
            self._class, self._run = error_class, 1
        return self.after > 0 and self._run >= self.after

    @property
    def streak(self) -> int:
        return self._run
