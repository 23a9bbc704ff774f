"""Which rollout errors are retried, and how long to wait: exponential backoff with jitter, capped.

Retryable: UNAVAILABLE, DEADLINE_EXCEEDED (a timed-out attempt too), RESOURCE_EXHAUSTED carrying
RetryInfo. Everything else (INVALID_ARGUMENT from the model, a bad tool name, an internal error)
fails the rollout at once. The clock and the randomness are injectable so tests never sleep.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rollmesh.mesh.errors import RollmeshError
from rollmesh.scheduler.spec import RetryPolicy

T = TypeVar("T")

UNAVAILABLE = "UNAVAILABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class ErrorClass:
    """What an exception means for the retry loop."""

    name: str  # the status code name, or the ErrorInfo reason for domain-level failures
    retryable: bool
    retry_after_s: float | None = None
    message: str = ""


def classify(exc: BaseException) -> ErrorClass:
    """The class of a rollout error. SDK errors and domain errors carry a code; timeouts are deadlines."""
    code_name: str | None = None
    retry_after: float | None = None
    reason = ""
    code = getattr(exc, "code", None)
    if isinstance(exc, RollmeshError):
        code_name, retry_after, reason = exc.code.name, exc.retry_after_s, exc.reason
    elif code is not None and hasattr(code, "name") and not callable(code):
        # rollmesh_client.RollmeshClientError (no import: the SDK is optional for domain code)
        code_name = str(code.name)
        retry_after = getattr(exc, "retry_after_s", None)
        reason = str(getattr(exc, "reason", ""))
    elif isinstance(exc, TimeoutError):
        return ErrorClass(DEADLINE_EXCEEDED, True, None, "the rollout attempt timed out")
    if code_name is None:
        return ErrorClass("INTERNAL", False, None, f"{type(exc).__name__}: {exc}")
    message = str(getattr(exc, "message", "") or exc)
    if code_name in (UNAVAILABLE, DEADLINE_EXCEEDED):
        return ErrorClass(code_name, True, retry_after, message)
    if code_name == RESOURCE_EXHAUSTED:
        return ErrorClass(code_name, retry_after is not None, retry_after, message)
    # Non-retryable: keep the specific reason when there is one (e.g. TOKEN_RECORD_MISMATCH).
    name = reason if reason and reason != code_name else code_name
    return ErrorClass(name, False, None, message)


class Backoff:
    """Delay before retry n (1-based): min(cap, initial * 2**(n-1)), jittered into [d/2, d]."""

    def __init__(self, policy: RetryPolicy, *, rand: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._rand = rand

    def delay(self, retry: int, retry_after_s: float | None = None) -> float:
        base = min(self.policy.max_backoff_s, self.policy.initial_backoff_s * (2 ** max(retry - 1, 0)))
        jittered = float(base * (0.5 + 0.5 * self._rand()))
        if retry_after_s is not None:
            jittered = max(jittered, retry_after_s)
        return min(jittered, self.policy.max_backoff_s)


class RolloutFailed(Exception):
    """Every attempt failed (or the first failed with a non-retryable error)."""

    def __init__(self, error: ErrorClass, attempts: int) -> None:
        super().__init__(f"{error.name}: {error.message}")
        self.error = error
        self.attempts = attempts


@dataclass
class RetryStats:
    retries: int = 0


async def with_retry(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    backoff: Backoff | None = None,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    on_retry: Callable[[ErrorClass, int, float], None] | None = None,
    per_attempt_deadline: bool = True,
) -> tuple[T, int]:
    """Run `attempt` until it succeeds; returns (result, attempts) or raises RolloutFailed.

    Each attempt runs under `policy.rollout_timeout_s` (when `per_attempt_deadline`).
    CancelledError propagates.
    """
    backoff = backoff or Backoff(policy)
    n = 0
    while True:
        n += 1
        try:
            if per_attempt_deadline:
                async with asyncio.timeout(policy.rollout_timeout_s):
                    return await attempt(), n
            return await attempt(), n
        except Exception as exc:
            err = classify(exc)
            if not err.retryable or n >= policy.max_attempts:
                raise RolloutFailed(err, n) from exc
            delay = backoff.delay(n, err.retry_after_s)
            if on_retry is not None:
                on_retry(err, n, delay)
            await sleep(delay)
