"""Registry errors, each with its status code and ErrorInfo reason."""

from __future__ import annotations

from rollmesh.mesh.errors import FailedPrecondition
from rollmesh.mesh.errors import InvalidArgument
from rollmesh.mesh.errors import NotFound


class ArtifactCollision(FailedPrecondition):
    """One name in more than one root (or twice in one root) while override is off."""

    reason = "ARTIFACT_COLLISION"


class ArtifactNotFound(NotFound):
    reason = "ARTIFACT_NOT_FOUND"


class BadArtifactName(InvalidArgument):
    reason = "BAD_ARTIFACT_NAME"


class UnknownKind(InvalidArgument):
    reason = "UNKNOWN_ARTIFACT_KIND"
