"""Open sessions: bounded in number, evicted after `ttl_s` of inactivity (clock injectable for tests).

Sessions sit in an OrderedDict in least-recently-used order, so eviction pops expired ones from
the front in O(expired); every access evicts first, and the service also sweeps periodically.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

from rollmesh.mesh.errors import InvalidArgument
from rollmesh.verifier.environment import Session
from rollmesh.verifier.errors import SessionExists
from rollmesh.verifier.errors import SessionMismatch
from rollmesh.verifier.errors import SessionNotFound
from rollmesh.verifier.errors import TooManySessions

Clock = Callable[[], float]
MAX_SESSION_ID_LEN = 256


@dataclass
class _Entry:
    session: Session
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionStore:
    def __init__(self, *, ttl_s: float, max_sessions: int, clock: Clock = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.evicted = 0
        self._expired: list[Session] = []  # evicted, their environments not told yet

    def __len__(self) -> int:
        return len(self._entries)

    def evict_expired(self) -> int:
        """Drop every session idle for at least ttl_s; returns how many."""
        now = self.clock()
        dropped = 0
        while self._entries:
            sid, entry = next(iter(self._entries.items()))
            if now - entry.last_used < self.ttl_s:
                break
            del self._entries[sid]
            self._expired.append(entry.session)
            dropped += 1
        self.evicted += dropped
        return dropped

    def take_expired(self) -> list[Session]:
        """The sessions evicted since the last call: what they hold outside this store (a bridged
        server's session, a container task's machine) is for their environment to release."""
        expired, self._expired = self._expired, []
        return expired

    def new_id(self, requested: str) -> str:
        if len(requested) > MAX_SESSION_ID_LEN:
            raise InvalidArgument(
                f"session id is {len(requested)} characters, the limit is {MAX_SESSION_ID_LEN}",
                reason="BAD_SESSION_ID",
            )
        return requested or uuid.uuid4().hex

    def reserve(self, session_id: str) -> None:
        """Check an id can be opened now (cap and uniqueness), before seeding state."""
        self.evict_expired()
        if session_id in self._entries:
            raise SessionExists(
                f"session {session_id!r} is already open", metadata={"session_id": session_id}
            )
        if len(self._entries) >= self.max_sessions:
            raise TooManySessions(
                f"{len(self._entries)} sessions open, the limit is {self.max_sessions} "
                f"(ROLLMESH_VERIFIER_MAX_SESSIONS); close sessions or wait for them to expire "
                f"after {self.ttl_s:g}s idle",
                metadata={"open": str(len(self._entries)), "limit": str(self.max_sessions)},
            )

    def add(self, session: Session) -> None:
        self.reserve(session.id)
        self._entries[session.id] = _Entry(session, self.clock())

    def _entry(self, session_id: str, environment: str | None) -> _Entry:
        self.evict_expired()
        entry = self._entries.get(session_id)
        if entry is None:
            raise SessionNotFound(
                f"no open session {session_id!r}: never seeded, closed, or expired after "
                f"{self.ttl_s:g}s idle",
                metadata={"session_id": session_id},
            )
        if environment is not None and entry.session.environment != environment:
            raise SessionMismatch(
                f"session {session_id!r} belongs to environment {entry.session.environment!r}, "
                f"not {environment!r}"
            )
        entry.last_used = self.clock()
        self._entries.move_to_end(session_id)
        return entry

    def get(self, session_id: str, environment: str | None = None) -> Session:
        return self._entry(session_id, environment).session

    def lock(self, session_id: str) -> asyncio.Lock:
        """The session's lock: tool calls on one session run one at a time."""
        return self._entry(session_id, None).lock

    def close(self, session_id: str) -> Session:
        entry = self._entry(session_id, None)
        del self._entries[session_id]
        return entry.session

    def clear(self) -> None:
        self._entries.clear()
