"""Verifier errors, each with its status code and ErrorInfo reason."""

from __future__ import annotations

from rollmesh.mesh import errors as mesh


class EnvironmentNotFound(mesh.NotFound):
    reason = "ENVIRONMENT_NOT_FOUND"


class EnvironmentBroken(mesh.FailedPrecondition):
    """The plugin failed to load; the message carries its error."""

    reason = "ENVIRONMENT_BROKEN"


class SessionNotFound(mesh.NotFound):
    """Never seeded, closed, or expired after its TTL."""

    reason = "SESSION_NOT_FOUND"


class SessionExists(mesh.AlreadyExists):
    reason = "SESSION_EXISTS"


class SessionMismatch(mesh.InvalidArgument):
    """A session used with an environment other than the one that seeded it."""

    reason = "SESSION_ENVIRONMENT_MISMATCH"


class TooManySessions(mesh.ResourceExhausted):
    reason = "SESSION_LIMIT"


class ToolNotFound(mesh.NotFound):
    reason = "TOOL_NOT_FOUND"


class BadTask(mesh.InvalidArgument):
    """The task JSON is not a JSON object."""

    reason = "BAD_TASK"


class VerifyTimeout(mesh.DeadlineExceeded):
    reason = "VERIFY_TIMEOUT"
