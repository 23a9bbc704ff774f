"""The uid a sandboxed run drops to as root: one per concurrent run, unique host-wide. Used by the
verifier's code sandbox (verifier/sandbox/core.py) and by every confined child (mesh/confine.py: managed
environment servers, external agent programs), all drawing from one block through one lease folder.

Runs sharing a uid hurt each other (RLIMIT_NPROC counts the uid's processes; in `process` mode a
run may signal every process of its uid), and every verifier on a host draws from the same block:
`rollmesh up` with several, several `rollmesh run`s, a scaled compose stack, containers sharing
the host's uids. So a run leases its uid: an exclusive flock on `LEASE_DIR/<uid>.lock`, which
closing the file, or the process dying, releases. The directory must be root's and writable by no
one else (the code cannot open the 0600 lock files, so it cannot hold a lease past its run); when it
cannot be made so, one warning says uids are unique within this verifier only. A run never waits for
a uid: when every uid is leased it shares one, as runs beyond the block's size always did.
"""

from __future__ import annotations

import collections
import fcntl
import os
import random
import stat
import threading
from pathlib import Path

from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.mesh.uids")

# Debian's reserved block 65000-65533, which no account is given. The isolation probe runs as nobody.
SANDBOX_UIDS = range(65533, 64999, -1)
PROBE_UID = 65534
LEASE_DIR = Path("/run/rollmesh/sandbox-uids")


class UidPool:
    def __init__(self) -> None:
        # Free uids, the longest free first (a run's last processes are reaped before its uid is
        # reused); from a random place in the block, so two verifiers rarely try the same ones first.
        first = random.randrange(len(SANDBOX_UIDS))
        self._free = collections.deque([*SANDBOX_UIDS[first:], *SANDBOX_UIDS[:first]])
        self._runs: collections.Counter[int] = collections.Counter()  # uids in use: runs on each
        self._leases: dict[int, int] = {}  # uid -> its flocked lock file
        self._dir: Path | None = None
        self._mutex = threading.Lock()  # leases may be taken and released on several threads' loops

    def use_leases(self, directory: Path = LEASE_DIR) -> None:
        """Lease uids host-wide through `directory`, made when missing. Blocking: call it off the loop."""
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = directory.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise OSError(f"not a directory of uid {os.geteuid()} that no one else may write")
            fd = os.open(directory / "probe.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a filesystem without flock raises
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning(
                "sandbox_uid_leases_unavailable",
                directory=str(directory),
                error=str(exc),
                effect="uids are unique within this verifier only: another verifier's run may share one",
            )
            return
        self._dir = directory

    async def lease(self) -> int:
        """A uid for one run, at once: the longest-free one no other process holds; when every uid is
        held, the longest-free one anyway, else the one the fewest of our runs use (shared).

        Taken on the event loop: per uid tried, an open of its lock file in the root-only folder
        (created once) and a non-blocking flock, neither of which waits for a disk or another
        process (a thread per lease cost the verifier ~10% of its CPU at 150 code verifies/s)."""
        return self._take(self._dir)

    def release(self, uid: int) -> None:
        """A run on `uid` ended; after its uid's last run the lease goes and the uid is free again."""
        with self._mutex:
            self._runs[uid] -= 1
            if self._runs[uid] > 0:
                return
            del self._runs[uid]
            fd = self._leases.pop(uid, -1)
            self._free.append(uid)
        if fd >= 0:
            os.close(fd)

    def _take(self, directory: Path | None) -> int:
        with self._mutex:
            candidates: list[int] = list(self._free) if directory else []
        busy: list[int] = []
        for uid in candidates:
            fd = _try_lock(f"{directory}/{uid}.lock")
            if fd < 0:
                busy.append(uid)
                continue
            with self._mutex:
                if uid in self._free:  # not taken unleased by a run of ours meanwhile
                    self._to_tail(busy)
                    self._free.remove(uid)
                    self._leases[uid] = fd
                    self._runs[uid] += 1
                    return uid
            os.close(fd)
        with self._mutex:
            self._to_tail(busy)
            uid = self._free.popleft() if self._free else min(self._runs.items(), key=lambda u: u[1])[0]
            self._runs[uid] += 1
            return uid

    def _to_tail(self, busy: list[int]) -> None:
        """Uids another process holds count as just used: when it lets one go, the processes of its
        run may still be dying (a pid namespace is torn down after its unshare is reaped), so the
        uids free longer come first."""
        if busy:
            free, moved = set(self._free), set(busy)
            self._free = collections.deque(
                [*(u for u in self._free if u not in moved), *(u for u in busy if u in free)]
            )


def _try_lock(path: str) -> int:
    """The lock file's descriptor, flocked; -1 when another holds it (or it cannot be locked)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return -1
    return fd
