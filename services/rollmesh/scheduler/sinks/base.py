"""The sink ABC: where a job's rollouts go. The JSONL file sink (default) and the gRPC
RolloutSink client implement it. `write` may wait: that wait is the backpressure that slows
dispatch, so a slow sink never grows an unbounded queue. A sink that cannot store a row raises
from `write` (never acknowledges it) and calls `on_error` so the job fails at once.

A returned `write` is not a stored row (the JSONL sink buffers a batch, the gRPC sink waits for the
trainer's acknowledgement): `not_stored()` names the rollouts written this run that the sink does
not hold, and a job's metrics leave them out (its truth is what its sink stored).
"""

from __future__ import annotations

from abc import ABC
from abc import abstractmethod
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from rollmesh.mesh.errors import RollmeshError
from rollmesh.scheduler.errors import RolloutTooLarge
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.timing import Reservoir

# The job's metrics, computed when called: a sink calls it once it knows what it stored.
MetricsOf = Callable[[], Json]


class Sink(ABC):
    # Called once when the sink can no longer store rows (a full disk): the job fails at once.
    on_error: Callable[[RollmeshError], None] | None = None
    # Called with the reward (metrics.measured_reward: None when masked) of a written rollout the
    # consumer did not consume: dropped as stale (a trainer's max_staleness; True: the job counts it
    # as stale_dropped) or never acknowledged by the close (False: not done). Either way it is not
    # succeeded.
    on_unconsumed: Callable[[float | None, bool], None] | None = None
    # Called with the key of each written rollout the consumer dropped as stale (after on_unconsumed):
    # a job that keeps batches full replaces its group (refill.py).
    on_stale: Callable[[RolloutKey], None] | None = None
    # Set by the job's run: how long each `write` took (timing.py; metrics.json's sink_write_s).
    write_times: Reservoir | None = None
    # Set by the job before `close`: figures of the run a sink's metrics.json adds to what it counts
    # from its rows (groups replaced and short: refill.py).
    extra_metrics: Json | None = None

    @abstractmethod
    async def open(self, job_id: str, *, total: int, spec: dict[str, Any]) -> set[RolloutKey]:
        """Prepare for a job; return the keys already held (resume skips them). Repairs a torn tail."""

    @abstractmethod
    async def write(self, rollout: Rollout) -> None:
        """Accept one rollout; returns once the sink has room for more (backpressure)."""

    async def write_group(self, rollouts: Sequence[Rollout]) -> list[tuple[Rollout, RolloutTooLarge]]:
        """Accept the rollouts of one group (a group-scored environment's task, verified together),
        in order; returns those too large for the sink, which were not written (every other one was).
        A sink that writes in batches keeps the group in one batch, so a crash stores all of it or
        none. Default: `write` each."""
        refused: list[tuple[Rollout, RolloutTooLarge]] = []
        for rollout in rollouts:
            try:
                await self.write(rollout)
            except RolloutTooLarge as exc:
                refused.append((rollout, exc))
        return refused

    @abstractmethod
    async def write_failure(self, failure: RolloutFailure) -> None:
        """Record a rollout that failed after every retry."""

    @abstractmethod
    async def close(self, *, state: str, metrics: MetricsOf | None) -> None:
        """Flush everything (fsync) and finish; `state` is the job's final state name. `metrics`
        (when given) is called after the last row was stored or given up on, never before."""

    def not_stored(self) -> frozenset[RolloutKey]:
        """Rollouts `write` accepted in this run that the sink does not hold (still buffered, lost
        to a failed write, sent and not acknowledged). A sink that stores on `write` holds them all."""
        return frozenset()

    def waiting(self) -> str:
        """Why writes have been waiting for a while now, e.g. "trainer sink at ADDR acknowledged
        nothing for 30 s (64 unacknowledged, the window)"; "" when they are not."""
        return ""
