"""The sandbox's wall-clock limit counts the time the code could run, not the time it waited for a
CPU that other work on the host held.

On a loaded host (vLLM replicas, a trainer and the verifier on the same cores) a correct solution
that needs 2 s of CPU can take 10 s of wall time, and a plain wall-clock limit scores it 0. Linux
counts, per task, the time it was runnable but waiting for a CPU (`/proc/<pid>/schedstat`, second
field). So:

- `run_within_wall_time(aw, session, wall_s)` awaits `aw`; at the deadline it reads the run's
  processes (every process of `session`, the sandbox being started as a session leader, and every
  descendant of that leader, whatever session it moved to) and moves the
  deadline out by the longest wait for a CPU any one of them had, unless the run's processes used
  more CPU than one task could in the time it was not waiting (then they competed with each other:
  the wait is their own doing, and threads or forks earn no extra time).
- The deadline never goes past `STARVED_AFTER` times `wall_s`: a run still waiting then raises
  `SandboxStarved` (the host, not the code, ran out of time: no verdict). A run that had its whole
  wall time raises `TimeoutError`, as `asyncio.timeout` would. Either way `aw` is cancelled. The
  time moved out is left in `credit.waited_s` when a `WallCredit` is given (the run's report says it).
- A process that left the session (`setsid`) still counts: it stays a descendant of the leader (an
  orphan goes to the run's pid-namespace init or the keeper, both descendants). Not counted, CPU
  hogs the code forked out of its session made its own wait the host's: an infinite loop ran to 4x
  the limit and was `SandboxStarved` (no verdict) instead of a timeout (reward 0), holding the CPUs.
Reading `/proc` is done off the event loop, only at deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from rollmesh.verifier.errors import SandboxStarved

T = TypeVar("T")

STARVED_AFTER = 4.0  # the longest a run may take, in multiples of its wall-clock limit
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class WallCredit:
    """Seconds a run was given past its wall-clock limit for the time it waited for a CPU."""

    waited_s: float = 0.0


def session_cpu(session: int, skip: int = 0) -> tuple[float, float]:
    """(CPU seconds used by the run's processes, the longest any one of them waited for a CPU in
    seconds), read from /proc; (0, 0) where /proc does not say. The run's processes: those of
    `session` and every descendant of its leader, whatever session it moved to (`setsid`), but
    for the first `skip` generations from the leader (a pre-started sandbox: unshare and the
    forker, whose CPU and waits since their start are not the run's)."""
    stats: dict[int, tuple[int, int, float]] = {}  # pid -> (ppid, session, CPU seconds)
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
                cpu = (int(fields[11]) + int(fields[12])) / _TICKS
                stats[int(entry)] = (int(fields[1]), int(fields[3]), cpu)
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
    members = {pid for pid, (_, sid, _) in stats.items() if sid == session}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(members)
    while todo:
        for kid in children.get(todo.pop(), ()):
            if kid not in members:
                members.add(kid)
                todo.append(kid)
    generation = {session}
    for _ in range(skip):
        members -= generation
        generation = {kid for pid in generation for kid in children.get(pid, ())}
    used = sum(stats[pid][2] for pid in members)
    waited = 0.0
    for pid in members:
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as f:
                waited = max(waited, int(f.read().split()[1]) / 1e9)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or a kernel without schedstat
    return used, waited


async def run_within_wall_time(
    aw: Awaitable[T], session: int, wall_s: float, credit: WallCredit | None = None, skip: int = 0
) -> T:
    """Await `aw` under the wall-clock limit `wall_s` of the run whose processes form `session`
    (module docstring; `skip` as `session_cpu` says); `credit`, when given, holds how far the
    deadline was moved out."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    start = loop.time()
    cap = start + STARVED_AFTER * wall_s
    deadline = start + wall_s
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
            if done:
                return task.result()
            now = loop.time()
            used, waited = await asyncio.to_thread(session_cpu, session, skip)
            # one task at a time runs for (elapsed - waited); using more, its tasks competed
            own_load = used > 1.25 * (now - start - waited) + 0.1
            earned = start + wall_s + (0.0 if own_load else waited)
            moved = min(earned, cap)  # where the deadline moves (earned >= start + wall_s: no credit < 0)
            if task.done():  # it ended while its processes were read: what it earned is its credit
                if credit is not None:
                    credit.waited_s = round(moved - start - wall_s, 4)
                return task.result()
            if earned <= now + 0.01:
                raise TimeoutError
            if now >= cap:
                raise SandboxStarved(
                    f"waited {waited:.1f} s for a CPU in {now - start:.1f} s (used {used:.2f} s): the host"
                    f" did not give the code its {wall_s:g} s of wall-clock time"
                )
            deadline = moved
            if credit is not None:
                credit.waited_s = round(deadline - start - wall_s, 4)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
            if not task.cancelled():
                task.exception()  # retrieved: it ended on its own while being cancelled
