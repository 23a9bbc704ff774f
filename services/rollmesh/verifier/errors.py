"""Verifier errors, each with its status code and ErrorInfo reason."""

from __future__ import annotations

from rollmesh.mesh.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)


class EnvironmentNotFound(NotFound):
    reason = "ENVIRONMENT_NOT_FOUND"


class EnvironmentBroken(FailedPrecondition):
    """The plugin failed to load; the message carries its error."""

    reason = "ENVIRONMENT_BROKEN"


class SessionNotFound(NotFound):
    """Never seeded, closed, or expired after its TTL."""

    reason = "SESSION_NOT_FOUND"


class SessionExists(AlreadyExists):
    reason = "SESSION_EXISTS"


class SessionMismatch(InvalidArgument):
    """A session used with an environment other than the one that seeded it."""

    reason = "SESSION_ENVIRONMENT_MISMATCH"


class TooManySessions(ResourceExhausted):
    reason = "SESSION_LIMIT"


class ToolNotFound(NotFound):
    reason = "TOOL_NOT_FOUND"


class BadTask(InvalidArgument):
    """The task JSON is not a JSON object."""

    reason = "BAD_TASK"


class VerifyTimeout(DeadlineExceeded):
    reason = "VERIFY_TIMEOUT"
