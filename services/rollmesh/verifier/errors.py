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


class SessionRequired(mesh.FailedPrecondition):
    """`verify` needs the rollout's session (the state its tools built lives in the verifier) and
    the call carried none: nothing can be judged, so it is an error, never a reward of 0."""

    reason = "SESSION_REQUIRED"


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
    """The task JSON is not a JSON object, or the row lacks what its environment needs to score it
    (no usable `expected_answer`). Environments raise it rather than score 0: a reward of 0 says
    the model was wrong, and here nobody can tell."""

    reason = "BAD_TASK"


class VerifyTimeout(mesh.DeadlineExceeded):
    reason = "VERIFY_TIMEOUT"


class JudgeFailed(mesh.Unavailable):
    """An LLM judge was needed for the verdict and gave none (its call failed, or its reply could
    not be read): the reward is unknown, so the verify fails (retryable) instead of scoring 0."""

    reason = "JUDGE_FAILED"


class CheckTimeout(mesh.DeadlineExceeded):
    """An environment's checker (e.g. math-verify in a worker) overran its hard timeout and was
    killed: the answer was never judged, so the verify fails (retryable) instead of scoring 0."""

    reason = "CHECK_TIMEOUT"


class CheckFailed(mesh.Unavailable):
    """An environment's checker raised or its worker process died: the answer was never judged,
    so the verify fails (retryable) instead of scoring 0."""

    reason = "CHECK_FAILED"
