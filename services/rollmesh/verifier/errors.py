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


class ChannelBroken(Exception):
    """The sandbox stopped answering as the protocol says: EOF, an oversized, malformed or
    out-of-order reply. The whole run fails."""


class CaseFailed(Exception):
    """A stdin/stdout case does not pass; the message says why."""


class WorkerTimeout(TimeoutError):
    """The call took longer than its timeout; its worker was killed."""


class WorkerError(RuntimeError):
    """The target raised, or the worker died; the message says which."""


class SandboxUnavailable(Exception):
    """The sandbox did not come up, so the code never ran (see the module docstring).
    `timed_out`: it did not answer within the wall-clock limit (a loaded host), else it died."""

    def __init__(self, message: str, *, timed_out: bool) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class SandboxStarved(SandboxUnavailable):
    """The code ran, but the host's other work held the CPUs so long that it did not get its
    wall-clock time within `STARVED_AFTER` x the limit (verifier/sandbox/clock.py): its outcome is
    unknown, not a timeout of its own."""

    def __init__(self, message: str) -> None:
        super().__init__(message, timed_out=True)


class BadValue(ValueError):
    """The sandbox sent something that is not a well-formed plain value: a failed test."""


class ToolError(Exception):
    """Raise from a tool to send the message back to the model as an error output."""


class TakesNoTurns(mesh.FailedPrecondition):
    """Step on a session of an environment that answers no assistant turns (`takes_turns` false)."""

    reason = "ENVIRONMENT_TAKES_NO_TURNS"


class BadEnvTurn(mesh.Internal):
    """An environment's `step` or `seed_session` answered something the loop cannot use: not an
    `EnvTurn`, a reward that is not a finite number, an assistant message (the policy did not write
    it), `info` that is not a JSON object. The step fails, visibly, instead of a guessed answer."""

    reason = "BAD_ENV_TURN"


class EnvServerUnreachable(mesh.Unavailable):
    """A bridged environment's server refused or dropped the connection (it is down)."""

    reason = "ENV_SERVER_UNREACHABLE"


class EnvServerTimeout(mesh.DeadlineExceeded):
    """A bridged environment's server did not answer within its timeout (it hangs)."""

    reason = "ENV_SERVER_TIMEOUT"


class EnvServerError(mesh.Unavailable):
    """A bridged environment's server answered a seed or a verify with an error status (5xx): no
    verdict, so the call fails (retryable) instead of scoring 0."""

    reason = "ENV_SERVER_ERROR"


class RewardFunctionFailed(mesh.Unavailable):
    """A bridged environment's own scoring raised (a reward or metric function, a judge's call, a
    parser inside one, or its own timeout): verifiers counts such a function 0; the bridge answers
    422 instead and the verify fails (retryable), so an answer nobody judged is never a reward of 0."""

    reason = "REWARD_FUNCTION_FAILED"


class EnvServerBadReply(mesh.Unavailable):
    """A bridged environment's server answered with something the protocol does not allow (not JSON,
    not an object, no numeric `reward`): no verdict, never a guessed one."""

    reason = "ENV_SERVER_BAD_REPLY"


class EnvServerAtCapacity(mesh.Unavailable):
    """A bridged environment's server refused a new session: it holds as many as it allows (an
    OpenEnv server's `max_concurrent_envs`). Retried; the environment's `max_sessions` keeps the
    bridge within the server's limit."""

    reason = "ENV_SERVER_AT_CAPACITY"


class ActionNotBuildable(mesh.FailedPrecondition):
    """A bridged environment's action schema is one the bridge cannot build an action for from a
    model's turn as its config says (OpenEnv: `action = "text"` on a schema with no string field
    the text can fill, or a schema that is not an object of fields): nothing the model writes could
    be sent, so the environment is broken, never stepped with a guessed action."""

    reason = "ACTION_NOT_BUILDABLE"


class EnvSessionLost(mesh.Unavailable):
    """The bridged server restarted after this rollout's session was seeded: the state its tools
    built is gone, so the rollout is retried from its seed instead of being scored on empty state."""

    reason = "ENV_SESSION_LOST"


class ReverifyUnsupported(mesh.FailedPrecondition):
    """The bridged server says (GET /reverify_mode) that its verdicts cannot be recomputed from a
    stored rollout."""

    reason = "REVERIFY_UNSUPPORTED"


class GroupScored(mesh.FailedPrecondition):
    """Verify (one rollout alone) on an environment that scores groups (`scores_groups`: a verifiers
    group rubric, a pairwise judge): its reward depends on the other rollouts of the task, which a
    per-rollout verify does not see, so it is refused, never scored alone (VerifyGroup scores it)."""

    reason = "GROUP_SCORED"


class BadGroup(mesh.InvalidArgument):
    """A VerifyGroup call without members, on an environment that does not score groups, or
    answered by the environment with a result count other than the group's size."""

    reason = "BAD_GROUP"
