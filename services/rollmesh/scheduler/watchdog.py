"""Every call a job makes to the gateway or the verifier, watched: reachable or not (retry.Outages),
and cut when the service hangs.

`Watchdog.watch(service, call)` brackets a call for `Outages` (started/ended, failed/recovered).
A stopped or wedged process still holds its connections: nothing fails, its calls just wait for
their deadlines, and gRPC keepalive notices a dead peer only after 60 + 20 s. So a service that
keeps calls waiting and answers none of them for 30 s (`Outages.quiet_shown_s`, or
`unavailable_budget_s` when shorter) is asked for its health (`Responsive`: a grpc.health Check,
PROBE_TIMEOUT_S). One that answers is slow, not hung: its calls go on. One that does not is
counted unreachable from its last answer (a port without a probe: once quiet for the whole
budget); once that outage reaches `unavailable_budget_s` its waiting calls are cut with its
`*_UNRESPONSIVE` error (an outage, retry.py) and the job fails naming the service. A hang shorter
than the budget cuts nothing: the calls complete once it runs again, each exactly once. Bound: a
hung service ends the job `unavailable_budget_s` after its last answer, plus PROBE_TIMEOUT_S and a
tick (and, when keepalive cut its calls first, up to one 20 s connection attempt of a retry).

One that has answered none of the job's calls for `silent_limit_s` (the engine: rollout_timeout_s,
the longest one attempt may take) hangs even if it answers its health check: a gateway whose model
server never answers. Retrying every rollout `max_attempts` times, each waiting that long, would only
make the job fail later (3 x 300 s by default): it fails now, or once the budget is spent.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from typing import TypeVar

from rollmesh.mesh import errors as mesh
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler.cut import Cut
from rollmesh.scheduler.cut import current_task
from rollmesh.scheduler.errors import GatewayUnresponsive
from rollmesh.scheduler.errors import VerifierUnresponsive
from rollmesh.scheduler.retry import FINAL
from rollmesh.scheduler.retry import Outages
from rollmesh.scheduler.retry import classify

log = get_logger("rollmesh.scheduler.watchdog")

GATEWAY, VERIFIER = "gateway", "verifier"
UNRESPONSIVE: Mapping[str, type[mesh.RollmeshError]] = {
    GATEWAY: GatewayUnresponsive,
    VERIFIER: VerifierUnresponsive,
}
PROBE_TIMEOUT_S = 5.0
# Errors that are not the service's answer: the call ran out of time or was cut on this side.
_NOT_ANSWERS = frozenset({"DEADLINE_EXCEEDED", "CANCELLED", "MODEL_CALL_DEADLINE"})
Probe = Callable[[float], Awaitable[bool]]  # Responsive.responsive: did it answer within the timeout?
R = TypeVar("R")


class Watchdog:
    """The calls waiting on each service, and the check that cuts them when the service hangs."""

    def __init__(
        self, outages: Outages, probes: Mapping[str, Probe | None], *, silent_limit_s: float = float("inf")
    ) -> None:
        self.outages = outages
        self.probes = probes
        self.silent_limit_s = silent_limit_s
        self._calls: collections.defaultdict[str, set[Cut]] = collections.defaultdict(set)
        self._why: dict[str, tuple[str, dict[str, str]]] = {}  # service -> (message, error metadata)
        self._probed: dict[str, bool] = {}  # a failed health check marked it down (not the budget alone)

    async def watch(self, service: str, call: Awaitable[R]) -> R:
        o = self.outages
        o.started(service)
        cut = Cut(current_task())
        calls = self._calls[service]
        calls.add(cut)
        try:
            try:
                result = await call
            except BaseException as exc:
                if cut.by_cut(exc):  # the service hangs
                    why, meta = self._why.get(service, (f"the {service} hangs", {}))
                    raise UNRESPONSIVE[service](why, metadata=meta) from None
                raise
            cut.ended(None)
        except Exception as exc:
            err = classify(exc)
            o.ended(service, answered=not err.outage and err.name not in _NOT_ANSWERS)
            if err.outage:
                o.failed(service)
            raise
        except BaseException:  # cancelled here: no word from the service either way
            o.ended(service, answered=False)
            raise
        finally:
            calls.discard(cut)
        o.ended(service, answered=True)
        o.recovered(service)
        return result

    async def run(self) -> None:
        """Check every tick (a quarter of the budget, at most 1 s) until cancelled."""
        tick = min(1.0, self.outages.budget_s / 4)
        while True:
            await asyncio.sleep(tick)
            try:
                await self.check()
            except Exception:  # a bug here must not leave the job's hangs unwatched for good
                log.exception("watchdog_check_failed")

    async def check(self) -> None:
        o = self.outages
        for service, calls in list(self._calls.items()):  # a first call may add a service meanwhile
            quiet = o.quiet_s(service)
            silent = o.silent_s(service) or 0.0
            mute = silent >= self.silent_limit_s  # none of the job's calls answered, ever
            if not calls or quiet is None or (quiet < min(o.budget_s, o.quiet_shown_s) and not mute):
                continue
            probe = self.probes.get(service)
            if service not in o.down:
                # Without a probe only the budget says it hangs; with one, a failed health check
                # says so now, and the outage began when it went quiet.
                if probe is None and quiet < o.budget_s and not mute:
                    continue
                if probe is not None and not mute and await probe(PROBE_TIMEOUT_S):
                    continue  # it answers its health check: slow, not hung; its calls go on
                quiet = o.quiet_s(service)
                if not calls or quiet is None:  # answered while we asked
                    continue
                o.failed(service, since=o.now() - (silent if mute else quiet))
                self._probed[service] = probe is not None and not mute
                log.warning(
                    "service_unresponsive",
                    service=service,
                    calls=len(calls),
                    quiet_s=round(max(quiet, silent), 1),
                )
            down = o.down_for(service)
            if down is None or down < o.budget_s:
                continue
            n = len(calls)
            self._why[service] = (
                (
                    f"the {service} answered none of the job's calls in {down:.0f} s (retry."
                    f"rollout_timeout_s is {self.silent_limit_s:g} s): what it serves never answers, or "
                    "needs a longer timeout",
                    {FINAL: "1"},  # the job's own limit, not the outage budget: no wait helps
                )
                if mute
                else (
                    f"the {service} answered none of {n} call{'s' if n != 1 else ''} for {down:.0f} s"
                    + (", nor a health check" if self._probed.get(service) else ""),
                    {},
                )
            )
            loop = asyncio.get_running_loop()
            for c in list(calls):
                if not c.cut:  # (once: a call already cut is on its way out)
                    c.at(loop.time(), loop)
