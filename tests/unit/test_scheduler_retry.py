"""Retry classification and backoff: injectable randomness and sleep, no real waits."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rollmesh.mesh.errors import InvalidArgument
from rollmesh.mesh.errors import ResourceExhausted
from rollmesh.mesh.errors import Unavailable
from rollmesh.scheduler.errors import RolloutFailed
from rollmesh.scheduler.errors import TokenRecordMismatch
from rollmesh.scheduler.retry import Backoff
from rollmesh.scheduler.retry import attempt_deadline_held
from rollmesh.scheduler.retry import classify
from rollmesh.scheduler.retry import with_retry
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh_client import InvalidArgumentError
from rollmesh_client import ResourceExhaustedError
from rollmesh_client import UnavailableError


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


def _upstream(
    code: grpc.StatusCode, reason: str, status: str = "", retry_after_s: float | None = None
) -> BaseException:
    from rollmesh_client import RollmeshClientError

    metadata = {"http_status": status} if status else {}
    return RollmeshClientError(
        "upstream", code=code, reason=reason, metadata=metadata, retry_after_s=retry_after_s
    )


def test_upstream_failure_classes_name_the_cause_and_decide_retries() -> None:
    """The gateway's ErrorInfo reasons (+ http_status) become the class; 5xx/429/timeouts/drops retry."""
    U, D, INV, F, R = (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    )
    cases = [
        (_upstream(U, "UPSTREAM_HTTP_ERROR", "500"), "UPSTREAM_HTTP_ERROR:500", True, False),
        (_upstream(U, "UPSTREAM_HTTP_ERROR", "503"), "UPSTREAM_HTTP_ERROR:503", True, False),
        (
            _upstream(R, "UPSTREAM_RATE_LIMITED", "429", retry_after_s=3.0),
            "UPSTREAM_RATE_LIMITED:429",
            True,
            False,
        ),
        (
            _upstream(R, "UPSTREAM_RATE_LIMITED", "429"),
            "UPSTREAM_RATE_LIMITED:429",
            True,
            False,
        ),  # even unhinted
        (_upstream(D, "UPSTREAM_TIMEOUT"), "UPSTREAM_TIMEOUT", True, False),
        (_upstream(U, "UPSTREAM_STREAM_DROPPED"), "UPSTREAM_STREAM_DROPPED", True, False),
        (_upstream(U, "UPSTREAM_UNREACHABLE"), "UPSTREAM_UNREACHABLE", True, True),
        (_upstream(INV, "UPSTREAM_REJECTED", "400"), "UPSTREAM_REJECTED:400", False, False),
        (_upstream(INV, "UPSTREAM_REJECTED", "404"), "UPSTREAM_REJECTED:404", False, False),
        (_upstream(F, "UPSTREAM_AUTH_FAILED", "401"), "UPSTREAM_AUTH_FAILED:401", False, False),
        (_upstream(U, "UPSTREAM_HTTP_ERROR", "400"), "UPSTREAM_HTTP_ERROR:400", False, False),
        (_upstream(U, "BACKEND_UNAVAILABLE"), "BACKEND_UNAVAILABLE", True, True),
        (_upstream(U, ""), "UNAVAILABLE", True, True),  # transport: the gateway itself is unreachable
        (_upstream(U, "SINK_UNAVAILABLE"), "SINK_UNAVAILABLE", True, False),
        (_upstream(grpc.StatusCode.CANCELLED, ""), "CANCELLED", True, True),  # the server stopped under us
    ]
    for exc, name, retryable, outage in cases:
        err = classify(exc)
        assert (err.name, err.retryable, err.outage) == (name, retryable, outage), exc
    assert classify(_upstream(R, "UPSTREAM_RATE_LIMITED", "429", retry_after_s=3.0)).retry_after_s == 3.0


class _FakeTime:
    """A clock that only `sleep` moves, and the job's Outages on it (budget 10 s)."""

    def __init__(self) -> None:
        from rollmesh.scheduler.retry import Outages

        self.now = 0.0
        self.outages = Outages(10.0, clock=lambda: self.now)

    async def sleep(self, s: float) -> None:
        self.now += s


@pytest.mark.parametrize(
    ("reason", "whom"),
    [("", "the gateway"), ("UPSTREAM_UNREACHABLE", "the model server behind the gateway")],
)
async def test_an_outage_waits_without_using_attempts_until_the_budget(reason: str, whom: str) -> None:
    t = _FakeTime()

    async def down() -> None:
        t.outages.failed("gateway")
        raise UnavailableError("connection refused", code=grpc.StatusCode.UNAVAILABLE, reason=reason)

    with pytest.raises(RolloutFailed) as info:
        await with_retry(down, RetryPolicy(max_attempts=2), sleep=t.sleep, outages=t.outages)
    err = info.value.error
    assert err.budget_exhausted and err.message.startswith(f"{whom} has been unreachable for 1"), err.message
    assert "(connection refused)" in err.message
    assert 10.0 <= t.now <= 12.0 and info.value.attempts == 1


async def test_an_outage_shorter_than_the_budget_costs_no_attempt() -> None:
    t = _FakeTime()
    calls = 0

    async def back_after_5s() -> str:
        nonlocal calls
        calls += 1
        if t.now < 5.0:
            t.outages.failed("gateway")
            raise UnavailableError("connection refused", code=grpc.StatusCode.UNAVAILABLE)
        t.outages.recovered("gateway")
        return "ok"

    result, attempts = await with_retry(
        back_after_5s, RetryPolicy(max_attempts=2), sleep=t.sleep, outages=t.outages
    )
    assert (result, attempts) == ("ok", 1) and calls > 2


def test_outages_say_what_the_job_waits_on() -> None:
    from rollmesh.scheduler.retry import Outages

    now = [100.0]
    outages = Outages(60.0, clock=lambda: now[0])
    assert outages.describe() == "" and outages.exhausted() is None
    outages.failed("verifier")
    now[0] = 112.0
    outages.failed("verifier")  # the clock runs from the first failure
    outages.failed("gateway")
    assert outages.describe() == "gateway unreachable for 0 s; verifier unreachable for 12 s"
    now[0] = 161.0
    assert outages.exhausted() == ("verifier", 61.0)
    outages.recovered("verifier")
    assert outages.down == ["gateway"] and outages.exhausted() is None


def test_outages_say_which_reachable_service_keeps_calls_waiting() -> None:
    """A hung service that keeps its connections is not unreachable: its calls just wait. After
    `quiet_shown_s` with calls waiting and no answer, describe() says so; any answer clears it."""
    from rollmesh.scheduler.retry import Outages

    now = [100.0]
    outages = Outages(60.0, clock=lambda: now[0], quiet_shown_s=30.0)
    outages.started("verifier")
    outages.ended("verifier", answered=True)  # heard at 100
    now[0] = 110.0
    outages.started("verifier")
    outages.started("verifier")
    now[0] = 139.0
    assert outages.describe() == ""  # waiting 29 s (it had nothing to answer from 100 to 110)
    now[0] = 141.0
    assert outages.describe() == "verifier answered none of 2 calls for 31 s"
    outages.ended("verifier", answered=False)  # cut on our side: still no word from it
    assert outages.describe() == "verifier answered none of 1 call for 31 s"
    outages.ended("verifier", answered=True)
    assert outages.describe() == ""
    # Calls that start after a long idle spell count from their start, not from the last answer.
    now[0] = 500.0
    outages.started("gateway")
    now[0] = 520.0
    assert outages.describe() == ""
    now[0] = 531.0
    outages.failed("gateway")  # unreachable is said once, as unreachable
    assert outages.describe() == "gateway unreachable for 0 s"


async def test_an_attempt_past_rollout_timeout_is_cut_and_retried_and_a_held_deadline_waits() -> None:
    """Each attempt runs under rollout_timeout_s: one past it is DEADLINE_EXCEEDED (retried); a
    cancel from outside is no attempt's end; while `attempt_deadline_held` runs, the deadline does not
    fire, and after it the attempt has at least `after_s` left."""
    policy = RetryPolicy(max_attempts=2, rollout_timeout_s=0.05, initial_backoff_s=0.001)
    tries = 0

    async def hangs() -> None:
        nonlocal tries
        tries += 1
        await asyncio.sleep(3600)

    with pytest.raises(RolloutFailed) as failed:
        await with_retry(hangs, policy)
    assert tries == 2 and failed.value.attempts == 2
    assert failed.value.error.name == "DEADLINE_EXCEEDED" and "timed out" in failed.value.error.message
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]

    task = asyncio.create_task(with_retry(hangs, RetryPolicy(rollout_timeout_s=60)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    async def held() -> str:
        with attempt_deadline_held(after_s=0.2):
            await asyncio.sleep(0.1)  # past rollout_timeout_s, held
        await asyncio.sleep(0.1)  # within the after_s it is given
        return "ok"

    assert await with_retry(held, RetryPolicy(max_attempts=1, rollout_timeout_s=0.05)) == ("ok", 1)
