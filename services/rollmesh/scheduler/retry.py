"""Which rollout errors are retried, and how long to wait: exponential backoff with jitter, capped.

Class names name the cause (they go to failures.jsonl, metrics and the run summary): the ErrorInfo
reason when there is one, else the status code name, plus `:<http_status>` when the error's
metadata has one (the gateway's upstream errors: "UPSTREAM_HTTP_ERROR:500", "UPSTREAM_REJECTED:400").

Retryable: UNAVAILABLE, DEADLINE_EXCEEDED (a timed-out attempt too), RESOURCE_EXHAUSTED carrying
RetryInfo; upstream 5xx, 429 (waiting at least its RetryInfo), timeouts, dropped streams and an
unreachable upstream. Not retryable: upstream 4xx and auth failures, and everything else
(INVALID_ARGUMENT from the model, a bad tool name, an internal error): they fail the rollout at once.

A model call cut by the adaptive deadline (deadline.py, reason MODEL_CALL_DEADLINE) is retried at
once, without a backoff: one hung call is not a sign of overload.

Outages: an error saying a service is unreachable (UNAVAILABLE with no reason,
BACKEND_UNAVAILABLE, UPSTREAM_UNREACHABLE; CANCELLED with no reason: the server stopped under the
call; GATEWAY_UNRESPONSIVE, VERIFIER_UNRESPONSIVE: calls cut while the service answered none,
errors.GatewayUnresponsive, watchdog.py) is an `outage` error. It does not use up the rollout's
attempts: the rollout waits (backoff capped at OUTAGE_MAX_BACKOFF_S) and tries again while the
job's `Outages` say the service has been unreachable for less than `unavailable_budget_s`; past the
budget it fails with `budget_exhausted` set, and the engine stops the job. The clock and the
randomness are injectable so tests never sleep.

One deadline, one class: a part of an attempt with a deadline of its own (an external agent
program, killed at its `timeout_s` as AGENT_PROGRAM_TIMEOUT) runs under `attempt_deadline_held`,
which keeps the attempt's deadline from firing during it and leaves the attempt at least `after_s`
once it is over, so its own deadline, never the attempt's, ends it (a slow start under load used to
let the attempt's fire first: DEADLINE_EXCEEDED for a program that overran).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import random
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from typing import TypeVar

from rollmesh.scheduler.cut import Cut
from rollmesh.scheduler.cut import current_task
from rollmesh.scheduler.errors import ErrorClass
from rollmesh.scheduler.errors import ProgramRun
from rollmesh.scheduler.errors import RolloutFailed
from rollmesh.scheduler.spec import RetryPolicy

T = TypeVar("T")

UNAVAILABLE = "UNAVAILABLE"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
CANCELLED = "CANCELLED"

# The gateway's upstream reasons (an OpenAI-compatible server behind it).
UPSTREAM_RETRYABLE = frozenset(
    {
        "UPSTREAM_HTTP_ERROR",  # 5xx
        "UPSTREAM_RATE_LIMITED",  # 429, honouring RetryInfo
        "UPSTREAM_TIMEOUT",
        "UPSTREAM_STREAM_DROPPED",
        "UPSTREAM_UNREACHABLE",
    }
)
UPSTREAM_PERMANENT = frozenset({"UPSTREAM_REJECTED", "UPSTREAM_AUTH_FAILED"})  # 4xx, 401/403
# UNAVAILABLE with one of these reasons means the callee (or what it serves) cannot be reached.
OUTAGE_REASONS = frozenset({"", UNAVAILABLE, "BACKEND_UNAVAILABLE", "UPSTREAM_UNREACHABLE"})
OUTAGE_MAX_BACKOFF_S = 2.0
MODEL_CALL_DEADLINE = "MODEL_CALL_DEADLINE"  # errors.ModelCallDeadline's reason: retried without a wait
# Error metadata key: this error ends the job as it is, no retry or outage wait changes it.
FINAL = "rollmesh-final"
GATEWAY_UNRESPONSIVE = "GATEWAY_UNRESPONSIVE"  # errors.GatewayUnresponsive's reason: an outage
# A hung service (errors.GatewayUnresponsive, errors.VerifierUnresponsive; watchdog.py): an outage.
UNRESPONSIVE = frozenset({GATEWAY_UNRESPONSIVE, "VERIFIER_UNRESPONSIVE"})


# The running attempt's deadline (with_retry's cut, cut.py), for `attempt_deadline_held`.
_ATTEMPT_DEADLINE: contextvars.ContextVar[Cut | None] = contextvars.ContextVar(
    "rollmesh_attempt_deadline", default=None
)


@contextlib.contextmanager
def attempt_deadline_held(after_s: float) -> Iterator[None]:
    """While the block runs the attempt's deadline does not fire (the block bounds itself); after
    it the attempt has at least `after_s` left (module doc). Outside an attempt: nothing."""
    deadline = _ATTEMPT_DEADLINE.get()
    if deadline is None or deadline.cut:
        yield
        return
    was = deadline.when()
    loop = asyncio.get_running_loop()
    deadline.at(None, loop)
    try:
        yield
    finally:
        if was is not None and not deadline.cut:
            deadline.at(max(was, loop.time() + after_s), loop)


def _class_name(code_name: str, reason: str, metadata: Mapping[str, str]) -> str:
    name = reason if reason and reason != code_name else code_name
    status = metadata.get("http_status", "")
    return f"{name}:{status}" if status else name


def classify(exc: BaseException) -> ErrorClass:
    """The class of a rollout error. SDK errors and domain errors carry a code; timeouts are deadlines."""
    err = _classify(exc)
    if isinstance(exc, ProgramRun) and exc.agent_program:
        err = replace(err, agent_program=exc.agent_program)
    return err


def _classify(exc: BaseException) -> ErrorClass:
    code = getattr(exc, "code", None)
    # A code comes on a RollmeshError or the SDK's RollmeshClientError (not imported: the SDK is optional).
    if code is None or not hasattr(code, "name") or callable(code):
        if isinstance(exc, TimeoutError):
            return ErrorClass(DEADLINE_EXCEEDED, True, None, "the rollout attempt timed out")
        return ErrorClass("INTERNAL", False, None, f"{type(exc).__name__}: {exc}")
    code_name = str(code.name)
    retry_after: float | None = getattr(exc, "retry_after_s", None)
    reason = str(getattr(exc, "reason", ""))
    metadata: Mapping[str, str] = getattr(exc, "metadata", None) or {}
    message = str(getattr(exc, "message", "") or exc)
    name = _class_name(code_name, reason, metadata)
    if reason in UPSTREAM_PERMANENT:
        return ErrorClass(name, False, None, message)
    if reason == "UPSTREAM_HTTP_ERROR" and metadata.get("http_status", "5").startswith("4"):
        return ErrorClass(name, False, None, message)  # a 4xx the gateway did not call a rejection
    if reason in UPSTREAM_RETRYABLE:
        outage = reason == "UPSTREAM_UNREACHABLE"
        return ErrorClass(name, True, retry_after, message, outage=outage)
    if code_name == UNAVAILABLE:
        return ErrorClass(name, True, retry_after, message, outage=reason in OUTAGE_REASONS)
    if code_name == CANCELLED and reason in ("", CANCELLED):
        # An RPC cancelled by the other side (we cancel by cancelling our task, which is no error
        # here): the server stopped under it, e.g. a restart. Same as unreachable.
        return ErrorClass(name, True, retry_after, message, outage=True)
    if code_name == DEADLINE_EXCEEDED:
        if FINAL in metadata:  # the watchdog's verdict for the whole job (watchdog.py)
            return ErrorClass(name, False, None, message, budget_exhausted=True)
        return ErrorClass(name, True, retry_after, message, outage=reason in UNRESPONSIVE)
    if code_name == RESOURCE_EXHAUSTED:
        return ErrorClass(name, retry_after is not None, retry_after, message)
    return ErrorClass(name, False, None, message)


def _behind(err: ErrorClass) -> bool:
    """The error is the gateway's report that what it serves from is unreachable."""
    return err.name.split(":")[0] in ("UPSTREAM_UNREACHABLE", "BACKEND_UNAVAILABLE")


class Outages:
    """How long each service has been unreachable without one call getting through, and how long
    one that is reachable has kept calls waiting without answering any.

    `failed(service)` at an outage error starts the clock (if not running; `since`: the outage began
    earlier); `recovered(service)` at any successful call stops it. `exhausted()` names a service
    unreachable for the whole budget; `answered_since(service, t)` says whether a call succeeded at
    or after `t`. `started(service)` / `ended(service)` bracket every call: a service with calls
    waiting that has answered none (with a result or an error) for `quiet_shown_s` shows in
    `describe()` (a hung process that still holds its connections is not unreachable, and its calls
    wait for their deadline: the job would look stuck with no reason given). Showing is all it does.
    """

    def __init__(self, budget_s: float, *, clock: Callable[[], float], quiet_shown_s: float = 30.0) -> None:
        self.budget_s = budget_s
        self.quiet_shown_s = quiet_shown_s
        self._clock = clock
        self._since: dict[str, float] = {}
        self._last_ok: dict[str, float] = {}
        self._waiting: collections.Counter[str] = collections.Counter()
        self._heard: dict[str, float] = {}  # last answer, or when calls started waiting after none
        self._first: dict[str, float | None] = {}  # the first call, until the service answers one

    def failed(self, service: str, *, since: float | None = None) -> None:
        self._since.setdefault(service, self._clock() if since is None else since)

    def recovered(self, service: str) -> None:
        self._since.pop(service, None)
        self._last_ok[service] = self._clock()

    def started(self, service: str) -> None:
        if not self._waiting[service]:
            self._heard[service] = max(self._heard.get(service, float("-inf")), self._clock())
        self._waiting[service] += 1
        self._first.setdefault(service, self._clock())

    def ended(self, service: str, *, answered: bool) -> None:
        self._waiting[service] -= 1
        if answered:
            self._heard[service] = self._clock()
            self._first[service] = None

    def now(self) -> float:
        return self._clock()

    def quiet_s(self, service: str) -> float | None:
        """Seconds `service` has kept calls waiting without answering any (None: no call waits)."""
        if self._waiting[service] <= 0:
            return None
        return self._clock() - self._heard.get(service, self._clock())

    def silent_s(self, service: str) -> float | None:
        """Seconds since the first call to `service` while it has answered none (None: it has)."""
        first = self._first.get(service)
        return None if first is None else self._clock() - first

    def answered_since(self, service: str, t: float) -> bool:
        return self._last_ok.get(service, float("-inf")) >= t

    def down_for(self, service: str) -> float | None:
        """Seconds `service` has been counted unreachable (None: it is not)."""
        since = self._since.get(service)
        return None if since is None else self._clock() - since

    def exhausted(self) -> tuple[str, float] | None:
        """(service, seconds unreachable) for a service past the budget, else None."""
        now = self._clock()
        for service, since in self._since.items():
            if now - since >= self.budget_s:
                return service, now - since
        return None

    @property
    def down(self) -> list[str]:
        return sorted(self._since)

    def describe(self) -> str:
        """ "gateway unreachable for 12 s" for each service down now, "verifier answered none of 8
        calls for 31 s" for each quiet one ("" when none is)."""
        now = self._clock()
        said = [f"{s} unreachable for {now - t:.0f} s" for s, t in sorted(self._since.items())]
        for s, n in sorted(self._waiting.items()):
            quiet = now - self._heard.get(s, now)
            if n > 0 and s not in self._since and quiet >= self.quiet_shown_s:
                said.append(f"{s} answered none of {n} call{'s' if n != 1 else ''} for {quiet:.0f} s")
        return "; ".join(said)


class Backoff:
    """Delay before retry n (1-based): min(cap, initial * 2**(n-1)), jittered into [d/2, d]."""

    def __init__(self, policy: RetryPolicy, *, rand: Callable[[], float] = random.random) -> None:
        self.policy = policy
        self._rand = rand

    def delay(self, retry: int, retry_after_s: float | None = None) -> float:
        base = min(
            self.policy.max_backoff_s, self.policy.initial_backoff_s * (2 ** min(max(retry - 1, 0), 30))
        )
        jittered = float(base * (0.5 + 0.5 * self._rand()))
        if retry_after_s is not None:
            jittered = max(jittered, retry_after_s)
        return min(jittered, self.policy.max_backoff_s)


async def with_retry(
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    backoff: Backoff | None = None,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    on_retry: Callable[[ErrorClass, int, float], None] | None = None,
    outages: Outages | None = None,
) -> tuple[T, int]:
    """Run `attempt` until it succeeds, each attempt under `policy.rollout_timeout_s`; returns
    (result, attempts) or raises RolloutFailed. With `outages`, outage errors wait as the module doc
    says (without: they count as attempts). CancelledError propagates."""
    backoff = backoff or Backoff(policy)
    n = 0  # attempts that count against max_attempts
    waits = 0  # retries while a service was unreachable
    while True:
        n += 1
        loop = asyncio.get_running_loop()
        deadline = Cut(current_task())  # (asyncio.timeout's cut, without a Timeout per attempt)
        deadline.at(loop.time() + policy.rollout_timeout_s, loop)
        held = _ATTEMPT_DEADLINE.set(deadline)
        try:
            try:
                result = await attempt()
            except BaseException as exc:
                if deadline.ended(exc):
                    raise TimeoutError from exc  # the attempt's deadline (as asyncio.timeout raises)
                raise
            finally:
                _ATTEMPT_DEADLINE.reset(held)
            deadline.ended(None)
            return result, n
        except Exception as exc:
            err = classify(exc)
            if err.outage and outages is not None:
                n -= 1  # an outage is not this rollout's fault
                gone = outages.exhausted()
                if gone is not None:
                    service, seconds = gone
                    # The gateway answering "its model server is unreachable" is not the gateway down.
                    whom = f"the model server behind the {service}" if _behind(err) else f"the {service}"
                    msg = (
                        f"{whom} has been unreachable for {seconds:.0f} s ({err.message}): longer than "
                        f"retry.unavailable_budget_s ({outages.budget_s:g} s) allows"
                    )
                    raise RolloutFailed(replace(err, message=msg, budget_exhausted=True), max(n, 1)) from exc
                waits += 1
                delay = min(backoff.delay(waits, err.retry_after_s), OUTAGE_MAX_BACKOFF_S)
                if on_retry is not None:
                    on_retry(err, waits, delay)
                await sleep(delay)
                continue
            if not err.retryable or n >= policy.max_attempts:
                raise RolloutFailed(err, n) from exc
            # A call cut by the adaptive deadline hung alone (many cuts raise the deadline instead):
            # try again at once, as a hedge would, rather than hold the slot through a backoff.
            delay = 0.0 if err.name == MODEL_CALL_DEADLINE else backoff.delay(n, err.retry_after_s)
            if on_retry is not None:
                on_retry(err, n, delay)
            await sleep(delay)
