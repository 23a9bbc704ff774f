"""Launch errors, each with its status code and ErrorInfo reason."""

from __future__ import annotations

from rollmesh.mesh import errors as mesh


class SidecarStartFailed(mesh.FailedPrecondition):
    """A sidecar server did not come up: the message names it, its interpreter, how it ended, the
    last line of its log and the log's path."""

    reason = "SIDECAR_START_FAILED"
