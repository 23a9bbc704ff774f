"""Retry classification and backoff: injectable randomness and sleep, no real waits."""

from __future__ import annotations

import grpc
import pytest

from rollmesh.mesh.errors import InvalidArgument, ResourceExhausted, Unavailable
from rollmesh.scheduler.retry import Backoff, RolloutFailed, classify, with_retry
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.scheduler.tokens import TokenRecordMismatch
from rollmesh_client import InvalidArgumentError, ResourceExhaustedError, UnavailableError


def test_classify_codes() -> None:
    assert classify(UnavailableError("x", code=grpc.StatusCode.UNAVAILABLE)).retryable
    assert classify(TimeoutError()).name == "DEADLINE_EXCEEDED" and classify(TimeoutError()).retryable
    bare = ResourceExhaustedError("full", code=grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert not classify(bare).retryable
    hinted = ResourceExhaustedError("full", code=grpc.StatusCode.RESOURCE_EXHAUSTED, retry_after_s=2.0)
    assert classify(hinted).retryable and classify(hinted).retry_after_s == 2.0
    bad = classify(InvalidArgumentError("bad", code=grpc.StatusCode.INVALID_ARGUMENT))
    assert (bad.name, bad.retryable) == ("INVALID_ARGUMENT", False)
    assert classify(TokenRecordMismatch("no")).name == "TOKEN_RECORD_MISMATCH"
    assert classify(ValueError("boom")).name == "INTERNAL"
    assert classify(Unavailable("down")).retryable and not classify(ResourceExhausted("x")).retryable


def test_backoff_doubles_jitters_and_caps() -> None:
    policy = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=3.0)
    top = Backoff(policy, rand=lambda: 1.0)
    low = Backoff(policy, rand=lambda: 0.0)
    assert [top.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [low.delay(n) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    assert top.delay(1, retry_after_s=2.5) == 2.5  # RetryInfo wins when longer
    assert top.delay(1, retry_after_s=60) == 3.0  # ... but the cap holds


async def test_with_retry_retries_retryable_then_succeeds() -> None:
    sleeps: list[float] = []
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise UnavailableError("down", code=grpc.StatusCode.UNAVAILABLE)
        return "ok"

    async def sleep(s: float) -> None:
        sleeps.append(s)

    policy = RetryPolicy(max_attempts=3, initial_backoff_s=1.0, max_backoff_s=10.0)
    result, attempts = await with_retry(
        attempt, policy, backoff=Backoff(policy, rand=lambda: 1.0), sleep=sleep
    )
    assert (result, attempts, sleeps) == ("ok", 3, [1.0, 2.0])


async def test_with_retry_gives_up_after_max_attempts() -> None:
    sleeps: list[float] = []

    async def attempt() -> None:
        raise UnavailableError("down", code=grpc.StatusCode.UNAVAILABLE)

    async def sleep(s: float) -> None:
        sleeps.append(s)

    with pytest.raises(RolloutFailed) as info:
        await with_retry(attempt, RetryPolicy(max_attempts=4), sleep=sleep)
    assert info.value.attempts == 4 and info.value.error.name == "UNAVAILABLE" and len(sleeps) == 3


async def test_invalid_argument_fails_at_once() -> None:
    async def attempt() -> None:
        raise InvalidArgument("max_tokens too large")

    async def sleep(s: float) -> None:
        raise AssertionError("must not sleep")

    with pytest.raises(RolloutFailed) as info:
        await with_retry(attempt, RetryPolicy(max_attempts=5), sleep=sleep)
    assert info.value.attempts == 1 and info.value.error.name == "INVALID_ARGUMENT"
