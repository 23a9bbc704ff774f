"""What every supervised child process shares, for `rollmesh up` (launch/processes.py), the
verifier's sidecars (launch/sidecar.py) and external agent programs (scheduler/program.py, which
asks for the parent's death signal in its own wrapper): the child leads its own session, dies with
its parent on Linux, and is killed as a whole process group.

- `die_with_parent()`: a `preexec_fn` asking the kernel to SIGTERM the child when this process
  dies (PR_SET_PDEATHSIG, set between fork and exec); None where prctl is unavailable.
- `kill_group(proc)`: SIGKILL the child's process group (it leads its own session), so nothing it
  started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Protocol

_PR_SET_PDEATHSIG = 1


class HasPid(Protocol):
    @property
    def pid(self) -> int: ...


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` (runs in the child between fork and exec) asking the kernel to SIGTERM the
    child when this process dies; None where prctl is unavailable. The libc lookup happens here, in
    the parent: the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call: the kernel will not tell us
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def kill_group(proc: HasPid) -> None:
    """SIGKILL the child's process group (it leads its own session): the child and what it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
