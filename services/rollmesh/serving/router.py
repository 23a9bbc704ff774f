"""Session-affinity request routing for the vLLM replicas, as a Ray Serve `RequestRouter`.

Serve runs one router per deployment handle, in the caller's process (here: the gateway). For each
call it reads four keyword arguments the replica methods accept:

- `pin_replica`: go to exactly this replica (abort and stats must reach a given replica); when it is
  gone the call waits for the caller's deadline, since no other replica can answer for it.
- `session_id`: the replica this session used last comes first (its prefix cache holds the turns
  so far); if it is gone or full, the session moves to the next-best replica and stays there.
- `avoid_replica`: skip this replica unless it is the only one (the backend's failover retry).
- `batch_size`: a batch call (batching.py) counts as that many requests in flight.

Everything else, and new sessions, goes to the least-loaded replica: fewest requests this router has
in flight there (counting choices not yet confirmed, so a burst spreads), then, for a new session,
fewest sessions homed there (a session brings more turns), then the replica's last reported queue
length (which sees other callers' load), then at random. Each choice is its own rank, so when a
replica rejects (at `max_ongoing_requests`) Serve falls through to the next.
The session table is an LRU bounded by `max_sessions`.

Serve may report a request completed before it reports it routed: it registers the completion
callback before it awaits the replica's acceptance, and both reach this loop as callbacks, so a short
call (stats, a few tokens) can finish first. Such a completion is remembered (per request and
replica, bounded) and the routing that follows is not counted: counted, it would never be released
and would keep new work off that replica for good.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest
from ray.serve.request_router import ReplicaID
from ray.serve.request_router import RequestRouter
from ray.serve.request_router import RunningReplica

DEFAULT_MAX_SESSIONS = 100_000
_MAX_TENTATIVE = 10_000


class SessionAffinityRouter(RequestRouter):  # type: ignore[misc]
    def initialize_state(self, max_sessions: int = DEFAULT_MAX_SESSIONS, **kwargs: Any) -> None:
        del kwargs
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[str, str] = OrderedDict()  # session id -> replica unique id
        self._in_flight: dict[str, int] = {}  # replica unique id -> requests routed, not completed
        # internal request id -> (replica unique id, requests it carries: a batch carries several)
        self._request_replica: dict[str, tuple[str, int]] = {}
        self._session_count: dict[str, int] = {}  # replica unique id -> sessions homed there
        self._tentative_ids: OrderedDict[str, str] = OrderedDict()  # request id -> chosen, unconfirmed
        self._tentative_count: dict[str, int] = {}
        # (request id, replica unique id) whose completion came first; also every rejected attempt
        # (a retry the same replica then accepts goes uncounted, for as long as it runs)
        self._completed_early: OrderedDict[tuple[str, str], None] = OrderedDict()

    def _load(self, uid: str) -> int:
        return self._in_flight.get(uid, 0) + self._tentative_count.get(uid, 0)

    def _load_key(self, replica: RunningReplica, *, new_session: bool) -> tuple[int, int, int, float]:
        uid = replica.replica_id.unique_id
        queued = self.replica_queue_len_cache.get(replica.replica_id) or 0
        sessions = self._session_count.get(uid, 0) if new_session else 0
        return (self._load(uid), sessions, queued, random.random())

    def _tentative(self, request_id: str, uid: str | None) -> None:
        """Count a choice before Serve confirms it, so a burst routed at once still spreads."""
        old = self._tentative_ids.pop(request_id, None)
        if old is not None:
            self._tentative_count[old] = max(0, self._tentative_count.get(old, 1) - 1)
        if uid is not None:
            self._tentative_ids[request_id] = uid
            self._tentative_count[uid] = self._tentative_count.get(uid, 0) + 1
            while len(self._tentative_ids) > _MAX_TENTATIVE:  # requests cancelled before routing
                _, stale = self._tentative_ids.popitem(last=False)
                self._tentative_count[stale] = max(0, self._tentative_count.get(stale, 1) - 1)

    def _home(self, session: str, uid: str) -> None:
        old = self._sessions.get(session)
        if old != uid:
            if old is not None:
                self._session_count[old] = self._session_count.get(old, 1) - 1
            self._session_count[uid] = self._session_count.get(uid, 0) + 1
        self._sessions[session] = uid
        self._sessions.move_to_end(session)
        while len(self._sessions) > self._max_sessions:
            _, evicted = self._sessions.popitem(last=False)
            self._session_count[evicted] = self._session_count.get(evicted, 1) - 1

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        kwargs: dict[str, Any] = dict(pending_request.kwargs) if pending_request is not None else {}
        if pending_request is not None:
            # Our ranks already cover every replica: when none accepts, Serve must back off before
            # asking again rather than spin (a pinned replica that is gone returns no rank at all).
            pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        pin = str(kwargs.get("pin_replica") or "")
        if pin:
            return [[by_id[pin]]] if pin in by_id else []
        avoid = str(kwargs.get("avoid_replica") or "")
        pool = [r for uid, r in by_id.items() if uid != avoid] or list(by_id.values())
        session = str(kwargs.get("session_id") or "")
        home = self._sessions.get(session) if session else None
        ranked = sorted(pool, key=lambda r: self._load_key(r, new_session=bool(session)))
        if home is not None and home in by_id and home != avoid:
            self._sessions.move_to_end(session)
            ranked.sort(key=lambda r: r.replica_id.unique_id != home)  # stable: home first
        if pending_request is not None and ranked:
            self._tentative(pending_request.metadata.internal_request_id, ranked[0].replica_id.unique_id)
        return [[r] for r in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        uid = replica_id.unique_id
        request_id = pending_request.metadata.internal_request_id
        self._tentative(request_id, None)
        if (request_id, uid) in self._completed_early:
            del self._completed_early[request_id, uid]  # it has finished already: nothing to count
        else:
            weight = max(1, int(pending_request.kwargs.get("batch_size") or 1))
            self._in_flight[uid] = self._in_flight.get(uid, 0) + weight
            self._request_replica[request_id] = (uid, weight)
        session = str(pending_request.kwargs.get("session_id") or "")
        if session and not pending_request.kwargs.get("pin_replica"):
            self._home(session, uid)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        uid = replica_id.unique_id
        routed = self._request_replica.get(internal_request_id)
        if routed is None or routed[0] != uid:  # not routed yet, or an attempt another replica rejected
            self._completed_early[(internal_request_id, uid)] = None
            while len(self._completed_early) > _MAX_TENTATIVE:
                self._completed_early.popitem(last=False)
            return
        del self._request_replica[internal_request_id]
        self._in_flight[uid] = max(0, self._in_flight.get(uid, 0) - routed[1])

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        uid = replica_id.unique_id
        self._in_flight.pop(uid, None)
        self._session_count.pop(uid, None)
        self._tentative_count.pop(uid, None)
        for session in [s for s, r in self._sessions.items() if r == uid]:
            del self._sessions[session]
