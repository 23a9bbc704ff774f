"""What every supervised child process shares, for `rollmesh up` (launch/processes.py), the
verifier's sidecars (launch/sidecar.py) and external agent programs (scheduler/drivers/program.py): the
child leads its own session, dies with its parent on Linux (mesh/confine.py's wrapper asks for the
death signal; never a `preexec_fn`, which makes Python fork, not vfork, and run every fork handler
in the child, gRPC's included), and is killed as a whole process group.

- `kill_group(proc)`: SIGKILL the child's process group (it leads its own session), so nothing it
  started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Protocol


class HasPid(Protocol):
    @property
    def pid(self) -> int: ...


def kill_group(proc: HasPid) -> None:
    """SIGKILL the child's process group (it leads its own session): the child and what it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
