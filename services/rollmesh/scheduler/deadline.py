"""The per-call deadline of model calls, following observed latency (#12.5).

A hung model call must not hold a concurrency slot for the whole `rollout_timeout_s`. Each model
call runs under `AdaptiveDeadline.guard()`, whose deadline is

    clamp(multiplier x p99 of the last `window` successful call latencies, floor_s, ceiling_s)

(defaults 3 x p99, floor 1 s, ceiling = `retry.rollout_timeout_s`); a rollout retried after a
cut gets 2x, then 4x ... that deadline (`scaled`), so a legitimately long call is not cut
forever. Until `warmup` calls have finished the deadline is the ceiling. When the estimate
moves by more than `RETIME_FACTOR` (a quarter) from the one calls in flight were last timed to,
they are re-deadlined too (measured from their own start), so a call that hung before the first
estimate is cut as soon as there is one; a smaller move applies to new calls only (re-timing each of
hundreds of calls in flight on every estimate was the scheduler's largest CPU cost per rollout).
A call that times out raises `ModelCallDeadline` (DEADLINE_EXCEEDED, reason MODEL_CALL_DEADLINE:
the retry policy tries the rollout again at once) and its latency is not a sample; when more than
`TOO_MANY_TIMEOUTS` of the recent calls time out (the model got slower, not a few hung calls), the
deadline doubles, up to the ceiling, until successful samples move the estimate again.
Timing uses the event loop's clock (what `asyncio.timeout` schedules on).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import contextvars
from types import TracebackType

from rollmesh.scheduler.cut import Cut
from rollmesh.scheduler.cut import current_task
from rollmesh.scheduler.errors import ModelCallDeadline

# How many times the current deadline this task's calls get: a rollout whose call was cut tries
# again with twice the deadline (then four times ...), so a call that is legitimately long (a rare
# long generation, the same again on retry) gets through, while a hung one is replaced at once.
_SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("rollmesh_deadline_scale", default=1.0)

TOO_MANY_TIMEOUTS = 0.05  # fraction of the last OUTCOMES calls
OUTCOMES = 200
RECOMPUTE_EVERY = 16  # successful samples between two estimates
RETIME_FACTOR = 1.25  # calls in flight are re-timed when the deadline moves more than this factor


class AdaptiveDeadline:
    def __init__(
        self,
        *,
        multiplier: float,
        floor_s: float,
        ceiling_s: float,
        window: int = 512,
        warmup: int = 20,
        enabled: bool = True,
    ) -> None:
        self.multiplier = multiplier
        self.floor_s = min(floor_s, ceiling_s)
        self.ceiling_s = ceiling_s
        self.warmup = warmup
        self.enabled = enabled
        self.current_s = ceiling_s
        self.timeouts = 0  # calls cut by this deadline, in all
        self._samples: collections.deque[float] = collections.deque(maxlen=window)
        self._ordered: list[float] = []  # the same samples, sorted (p99 reads it: no sort per estimate)
        self._outcomes: collections.deque[bool] = collections.deque(maxlen=OUTCOMES)  # True: timed out
        self._since_estimate = 0
        self._active: dict[int, tuple[float, float, Cut]] = {}  # the calls in flight
        self._timed_to_s = ceiling_s  # the deadline calls in flight were last re-timed to

    @staticmethod
    def scaled(factor: float) -> contextlib.AbstractContextManager[None]:
        """Calls made in this block (this task) get `factor` x the deadline."""
        return _Scaled(factor)

    def guard(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Run the body under the current deadline; it may be moved while the body runs."""
        return _Guard(self) if self.enabled else contextlib.nullcontext()

    def _cut_error(self, start: float, now: float, scale: float) -> ModelCallDeadline:
        """A call started at `start` (loop time) was cut at `now` by this deadline: count it, say so."""
        self._timed_out()
        return ModelCallDeadline(
            f"the model call took over {now - start:.2f} s: the adaptive deadline "
            f"({self.multiplier:g} x recent p99 {self.p99():.3f} s, at least {self.floor_s:g} s"
            + (f", x{scale:g} for this retry" if scale != 1 else "")
            + ")"
        )

    def _observe(self, latency_s: float) -> None:
        samples, ordered = self._samples, self._ordered
        if len(samples) == samples.maxlen:  # the oldest leaves the window
            del ordered[bisect.bisect_left(ordered, samples[0])]
        samples.append(latency_s)
        bisect.insort(ordered, latency_s)
        self._outcomes.append(False)
        self._since_estimate += 1
        if len(self._samples) >= self.warmup and (
            self._since_estimate >= RECOMPUTE_EVERY or len(self._samples) == self.warmup
        ):
            self._since_estimate = 0
            self._set(self.multiplier * self.p99())

    def _timed_out(self) -> None:
        self.timeouts += 1
        self._outcomes.append(True)
        cut = sum(self._outcomes)
        if cut >= 3 and cut > TOO_MANY_TIMEOUTS * len(self._outcomes):
            self._outcomes.clear()
            self._set(self.current_s * 2)

    def p99(self) -> float:
        ordered = self._ordered
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0

    def _bounded(self, deadline_s: float) -> float:
        return min(self.ceiling_s, max(self.floor_s, deadline_s))

    def _set(self, deadline_s: float) -> None:
        new = self._bounded(deadline_s)
        if new == self.current_s:
            return
        self.current_s = new
        if 1 / RETIME_FACTOR <= new / self._timed_to_s <= RETIME_FACTOR:
            return
        self._timed_to_s = new
        for start, scale, cut in list(self._active.values()):
            if not cut.cut:
                cut.at(start + self._bounded(new * scale), asyncio.get_running_loop())


class _Scaled:
    """`AdaptiveDeadline.scaled`'s block: a class, not a `contextmanager` (a generator and its wrapper
    for every attempt of every rollout: ~1 us more)."""

    __slots__ = ("_factor", "_token")

    def __init__(self, factor: float) -> None:
        self._factor = factor

    def __enter__(self) -> None:
        self._token = _SCALE.set(self._factor)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _SCALE.reset(self._token)


class _Guard:
    """One model call under an `AdaptiveDeadline` (its `guard()`): the call's cut (cut.py), re-timed with
    the estimate while the call runs; a cut is a `ModelCallDeadline`, a call that returns is a sample.
    A class, not an `asynccontextmanager` (an async generator per model call, which the event loop's
    first-iteration hook also tracks), and a `Cut`, not an `asyncio.timeout_at`, for the same deadline."""

    __slots__ = ("_cut", "_deadline", "_loop", "_scale", "_start")

    def __init__(self, deadline: AdaptiveDeadline) -> None:
        self._deadline = deadline

    async def __aenter__(self) -> None:
        d = self._deadline
        self._loop = loop = asyncio.get_running_loop()
        self._cut = cut = Cut(current_task())
        self._start, self._scale = start, scale = loop.time(), _SCALE.get()
        cut.at(start + d._bounded(d.current_s * scale), loop)
        d._active[id(cut)] = (start, scale, cut)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        d, cut = self._deadline, self._cut
        del d._active[id(cut)]
        if cut.by_cut(exc):  # our cut, or the body's own TimeoutError raised as we cut it
            raise d._cut_error(self._start, self._loop.time(), self._scale) from None
        if exc is None:
            d._observe(self._loop.time() - self._start)
