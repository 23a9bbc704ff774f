"""Errors of the CLI's own work (`rollmesh reverify`, following a job), reported in one line like a
service's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollmesh.mesh.errors import DeadlineExceeded
from rollmesh.mesh.errors import Unavailable

if TYPE_CHECKING:
    from rollmesh_client.v1 import scheduler_pb2 as pb


class VerifierUnavailable(Unavailable):
    reason = "VERIFIER_UNAVAILABLE"


class ReverifyTimeout(DeadlineExceeded):
    reason = "REVERIFY_TIMEOUT"


class SchedulerLost(Exception):
    """The scheduler stopped answering while a job was followed."""

    def __init__(self, job: pb.Job, cause: Exception) -> None:
        super().__init__(str(cause))
        self.job, self.cause = job, cause
