"""The host of a job's agent program by its mode (drivers/modes.py): program.py's `PerRollout`
("command"), drivers/warm.py's `WarmStart` ("warm") or drivers/agent_server.py's `AgentServer`
("server")."""

from __future__ import annotations

from rollmesh.mesh.confine import UidLeases
from rollmesh.scheduler.drivers.agent_server import AgentServer
from rollmesh.scheduler.drivers.modes import SERVER
from rollmesh.scheduler.drivers.modes import WARM
from rollmesh.scheduler.drivers.modes import check_mode
from rollmesh.scheduler.drivers.program import PerRollout
from rollmesh.scheduler.drivers.program import ProgramHost
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.warm import WarmStart


def program_host(mode: str, program: ProgramSpec, uids: UidLeases) -> ProgramHost:
    """The job's host (the plan checked `mode`: ValueError here only for a spec it never saw)."""
    mode = check_mode(mode, program.argv)
    if mode == WARM:
        return WarmStart(program, uids)
    if mode == SERVER:
        return AgentServer(uids)
    return PerRollout(uids)
