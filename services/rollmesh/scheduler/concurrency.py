"""The bound on rollouts in flight: fixed, or adaptive (AIMD on the gateway's latency).

Adaptive: every `window` model turns, compare the window's mean latency to the best window seen.
Flat (within TOLERANCE x best) -> raise the limit; queueing (above it) -> cut it by DECREASE.
Raising doubles the limit until the first cut (slow start, as TCP does: a batching engine such as
vLLM needs hundreds of requests in flight, which additive steps from 16 reach only after thousands
of turns), then adds sqrt(limit). Always within [min_limit, max_limit].

Latency that rises while the window's throughput (turns per second) also rises by `rate_gain` over
the previous window's is not queueing: a batching engine (vLLM) serves a bigger batch at a lower
cost per request, so its latency grows with the batch while it completes more. Such a window
raises the limit too; a slower window that completes no more than the previous one cuts it.

A cut never goes below the knee while throughput holds: the knee is the smallest limit whose window
completed at least KNEE_SHARE of the best sustained rate (the best rate two consecutive windows
both reached: one noisy window is not a peak). A window that queues but still completes at least
HOLD_SHARE of that rate is cut no lower than the knee, so the limit settles where the engine's
throughput peaked instead of falling back to where latency was lowest. A window slower than that
(the backend itself got slower) cuts as before.

A known engine capacity (`floor`: the requests the model's engines run at once, which the gateway
reports for vLLM replicas) is the lowest a cut goes: fewer rollouts in flight than the engines' batch
slots only leave slots empty (the scheduler starts the limit above it: engine.py CAPACITY_HEADROOM).
Without one the limit starts small.

The host's CPU (`HostCpu`, for jobs whose rollouts run agent programs on this host: their CPU is
the bound, not the model's): a window in which the host's cores were busy (FULL_SHARE of their
time) does not raise the limit; one with more runnable processes than OVER_PER_CORE per core cuts
it, whatever the latency said, to no lower than the limit the job started at (engine.py: 2 per
core). Below that the cores idle while each rollout waits on its model calls and its process's
start: a host busy with other work, or the job's own processes, held warm-started programs at one
rollout in flight, 3-10 rollouts/s where 4 in flight did 28 and 16 did 29 (2 cores, load 7-14).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

TOLERANCE = 1.5
DECREASE = 0.7
KNEE_SHARE = 0.9
HOLD_SHARE = 0.8
FULL_SHARE = 0.9
OVER_PER_CORE = 2.0


class HostCpu:
    """How busy this host's cores were since the last look (/proc/stat; elsewhere never busy)."""

    def __init__(self, stat: Path = Path("/proc/stat"), cores: int | None = None) -> None:
        self.stat = stat
        self.cores = cores or os.cpu_count() or 1
        self._last = self._times()

    def _times(self) -> tuple[int, int] | None:
        """(busy, total) jiffies of all cores."""
        try:
            first = self.stat.read_text().split("\n", 1)[0].split()
        except OSError:
            return None
        values = [int(v) for v in first[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values) - idle, sum(values)

    def _running(self) -> int:
        try:
            for line in self.stat.read_text().splitlines():
                if line.startswith("procs_running "):
                    return int(line.split()[1]) - 1  # less the one reading
        except (OSError, ValueError):
            pass
        return 0

    def state(self) -> str:
        """ "over" (more runnable than OVER_PER_CORE x cores now), "full" (busy FULL_SHARE of the
        time since the last look) or "" (room)."""
        now, last = self._times(), self._last
        self._last = now
        if self._running() > OVER_PER_CORE * self.cores:
            return "over"
        if now is None or last is None or now[1] <= last[1]:
            return ""
        return "full" if (now[0] - last[0]) / (now[1] - last[1]) >= FULL_SHARE else ""


class Limiter:
    """A semaphore whose limit may change while held. `acquire` waits for room; `release` frees it."""

    def __init__(
        self,
        limit: int,
        *,
        adaptive: bool = False,
        max_limit: int = 1024,
        floor: int = 0,
        rate_gain: float = 1.1,
        clock: Callable[[], float] = time.monotonic,
        cpu: HostCpu | None = None,
    ) -> None:
        self.adaptive = adaptive
        self.max_limit = max(1, max_limit)
        self.min_limit = min(max(1, floor), self.max_limit)
        self.limit = min(max(limit, self.min_limit), self.max_limit)
        if cpu is not None:  # (module doc: the host's CPU never cuts below the start)
            self.min_limit = self.limit
        self.in_use = 0
        self.peak = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._samples: list[float] = []
        self._best: float | None = None
        self.rate_gain = rate_gain
        self._clock = clock
        self.cpu = cpu
        self._window_start = 0.0
        self._last_rate = 0.0  # turns per second of the previous window
        self._slow_start = True  # doubling until the first cut
        self._windows: collections.deque[tuple[int, float]] = collections.deque(maxlen=32)  # (limit, rate)

    async def acquire(self) -> None:
        while self.in_use >= self.limit:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self.in_use += 1
        self.peak = max(self.peak, self.in_use)

    def release(self) -> None:
        """Synchronous, so it also runs in a `finally` of a cancelled task."""
        self.in_use -= 1
        while self._waiters and self.in_use < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                break

    def observe(self, latency_s: float) -> None:
        """One model-turn latency (adaptive mode); may move the limit."""
        if not self.adaptive:
            return
        now = self._clock()
        if not self._samples:
            self._window_start = now
        self._samples.append(latency_s)
        window = max(8, min(self.limit, 256))
        if len(self._samples) < window:
            return
        mean = sum(self._samples) / len(self._samples)
        elapsed = now - self._window_start
        rate = (len(self._samples) - 1) / elapsed if elapsed > 0 else 0.0
        self._samples.clear()
        if self._best is None or mean < self._best:
            self._best = mean
        paying = self._last_rate > 0 and rate >= self._last_rate * self.rate_gain
        self._last_rate = rate
        self._windows.append((self.limit, rate))
        cpu = self.cpu.state() if self.cpu is not None else ""
        if cpu == "over":
            self._slow_start = False
            self.limit = max(self.min_limit, int(self.limit * DECREASE))
        elif cpu == "full":
            self._slow_start = False  # the cores are the bound: hold
        elif mean <= self._best * TOLERANCE or paying:
            step = self.limit if self._slow_start else max(1, int(math.sqrt(self.limit)))
            self.limit = min(self.max_limit, self.limit + step)
        else:
            self._slow_start = False
            cut = max(self.min_limit, int(self.limit * DECREASE))
            self.limit = max(cut, min(self.limit, self._knee(rate)))
            # The baseline drifts up slowly so a permanently slower backend is not punished forever.
            self._best *= 1.05
        # A raised limit takes effect at the next release (observe runs inside a rollout in flight).

    def _knee(self, rate: float) -> int:
        """The lowest limit a cut may reach at this window's `rate` (class docstring): the knee
        while `rate` holds HOLD_SHARE of the best sustained rate, else no floor (0)."""
        windows = list(self._windows)
        sustained = max((min(a[1], b[1]) for a, b in itertools.pairwise(windows)), default=0.0)
        if sustained <= 0 or rate < HOLD_SHARE * sustained:
            return 0
        return min(limit for limit, r in windows if r >= KNEE_SHARE * sustained)
