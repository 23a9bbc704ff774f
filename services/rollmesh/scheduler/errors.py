"""Scheduler errors, each with its status code and ErrorInfo reason; `ErrorClass`, what a rollout
error means for the retry loop (retry.py's `classify` makes it), which `RolloutFailed` carries."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from typing import Any

from rollmesh.mesh import errors as mesh


class InvalidJobSpec(mesh.InvalidArgument):
    """A JobSpec field is out of range or missing (negative numbers, no dataset, ...)."""

    reason = "INVALID_JOB_SPEC"


class InvalidShard(mesh.InvalidArgument):
    reason = "INVALID_SHARD"


class MalformedDatasetRow(mesh.InvalidArgument):
    """A dataset line is not a JSON object with a usable `responses_create_params.input`."""

    reason = "MALFORMED_DATASET_ROW"


class NoPrompt(mesh.InvalidArgument):
    """A row with an empty `responses_create_params.input` (NeMo Gym's rows whose server gives the
    prompt) whose environment gave no first observation: the model would be asked nothing."""

    reason = "NO_PROMPT"


class DatasetRowTooLarge(mesh.InvalidArgument):
    """A dataset line too large for the requests made from it to fit in a gRPC message."""

    reason = "DATASET_ROW_TOO_LARGE"


class DatasetNotFound(mesh.NotFound):
    reason = "DATASET_NOT_FOUND"


class BenchmarkNotFound(mesh.NotFound):
    reason = "BENCHMARK_NOT_FOUND"


class InvalidBenchmark(mesh.InvalidArgument):
    reason = "INVALID_BENCHMARK"


class JobNotFound(mesh.NotFound):
    reason = "JOB_NOT_FOUND"


class JobFinished(mesh.FailedPrecondition):
    """Cancelling a job that already ended."""

    reason = "JOB_FINISHED"


class JobRunning(mesh.FailedPrecondition):
    """Resuming a job that is still running in this scheduler."""

    reason = "JOB_RUNNING"


class ResumeMismatch(mesh.FailedPrecondition):
    """Resuming a job with settings that ask for other rollouts (another dataset, limit, repeats,
    sampling ...): its folder would mix two jobs' rows under one set of keys."""

    reason = "RESUME_SPEC_MISMATCH"


class OffsetExpired(mesh.FailedPrecondition):
    """StreamRollouts asked for an offset no longer held in memory and the sink keeps no file."""

    reason = "OFFSET_EXPIRED"


class RequestIdReused(mesh.AlreadyExists):
    """The same request_id came with a different spec."""

    reason = "REQUEST_ID_REUSED"


class DuplicateRollout(mesh.AlreadyExists):
    """A key was written twice: the sink keeps every key exactly once."""

    reason = "DUPLICATE_ROLLOUT"


class CorruptSinkFile(mesh.FailedPrecondition):
    """A complete line of a sink file is not a JSON object (not a torn tail: that is repaired)."""

    reason = "SINK_FILE_CORRUPT"


class CorruptJobFile(mesh.FailedPrecondition):
    """A job.json that parses but holds a field of the wrong type or out of range (edited by hand,
    corrupted): that job is left out of listings, and asking for it names the file."""

    reason = "JOB_FILE_CORRUPT"


class MixedJobs(mesh.InvalidArgument):
    """Rows of two different jobs share a key: the files are not shards of one job (whose keys are
    disjoint), so keeping either row would silently mix two runs in one set of metrics."""

    reason = "RESULTS_OF_DIFFERENT_JOBS"


class SinkClosed(mesh.FailedPrecondition):
    reason = "SINK_CLOSED"


class JobFolderInUse(mesh.FailedPrecondition):
    """Another process (a scheduler, a `rollmesh run`) holds the job folder's writer lock: it is
    running this job now (or hangs, stopped). Two writers would run the same keys twice, so the
    second one writes nothing and fails; resume once the other has ended."""

    reason = "JOB_FOLDER_IN_USE"


class OutputDirUnusable(mesh.FailedPrecondition):
    """The job folder cannot be created or written (the output dir is a file, not writable, or
    full): the submit fails naming it, and no job is recorded."""

    reason = "OUTPUT_DIR_UNUSABLE"


class SinkWriteFailed(mesh.Internal):
    """The sink could not store rows (a full disk, an I/O error): the job fails at once with this
    reason; rows of the failed batch are not on disk and not counted, so a resume re-runs them."""

    reason = "SINK_WRITE_FAILED"


class TokenRecordMismatch(mesh.Internal):
    """A turn's prompt does not extend the ids so far, or logprobs do not line up with outputs."""

    reason = "TOKEN_RECORD_MISMATCH"


class GenerationAborted(mesh.Unavailable):
    """A model turn came back with finish_reason "abort" (aborted on the engine, or by the gateway's
    Abort): its output is cut where the abort landed, so it is never scored nor recorded; the
    rollout runs again (retryable)."""

    reason = "GENERATION_ABORTED"


class BadReward(mesh.Internal):
    """The verifier answered a reward (or a component) that is not a finite number: stored, a NaN
    would poison every mean and pass@k it enters. The rollout fails (not retried) instead."""

    reason = "VERIFIER_BAD_REWARD"


class ModelCallDeadline(mesh.DeadlineExceeded):
    """A model call outlived the adaptive deadline (retryable, like every DEADLINE_EXCEEDED)."""

    reason = "MODEL_CALL_DEADLINE"


class GatewayUnresponsive(ModelCallDeadline):
    """A model call cut by the adaptive deadline while other calls were in flight (or the gateway
    was already down) and the gateway answered none since this one started: the gateway hangs
    (stopped, wedged), not the call. An outage: the rollout waits within `unavailable_budget_s`."""

    reason = "GATEWAY_UNRESPONSIVE"


class VerifierUnresponsive(mesh.DeadlineExceeded):
    """Verifier calls cut because the verifier answered none of them, nor a health check, for
    `unavailable_budget_s` (watchdog.py): an outage that spent the budget; the job fails naming it."""

    reason = "VERIFIER_UNRESPONSIVE"


class SinkUnavailable(mesh.Unavailable):
    reason = "SINK_UNAVAILABLE"


class RolloutTooLarge(mesh.ResourceExhausted):
    """A rollout over the gRPC message limit, which a gRPC sink cannot send: that rollout fails."""

    reason = "ROLLOUT_TOO_LARGE"


class GroupMemberFailed(mesh.FailedPrecondition):
    """A rollout of a group-scored task (the environment's `scores_groups`) that succeeded, failed
    because another rollout of its group failed: its reward depends on the whole group, which was
    never verified. Not evidence against this rollout (never counted toward fail fast); a resumed
    job runs the whole group again."""

    reason = "GROUP_MEMBER_FAILED"


class GroupReplaced(mesh.FailedPrecondition):
    """A rollout that succeeded in a group that failed (another of its rollouts failed) while the job
    replaces failed groups (JobSpec.replace_groups): a fresh group takes its place, so none of this one
    goes to the trainer. Written to the failures sidecar as evidence; not counted as the job's failure."""

    reason = "GROUP_REPLACED"


class ReplacementsExhausted(mesh.ResourceExhausted):
    """A failed group could not be replaced: the job's bound on replacements was used up, or (for
    "next_task") the dataset has no unused task left. The job delivers fewer full groups than it
    has tasks, and ends COMPLETED_WITH_FAILURES naming this class."""

    reason = "REPLACEMENTS_EXHAUSTED"


class GroupPartlyStored(mesh.FailedPrecondition):
    """Some rollouts of a group-scored task are stored (with the verdict of the group they were
    verified in) and the others are not (a torn write, a row too large for the sink): running the
    missing ones would verify them against another group, so they fail instead of being scored
    against rollouts their stored siblings never saw."""

    reason = "GROUP_PARTLY_STORED"


@dataclass(frozen=True)
class ErrorClass:
    """What an exception means for the retry loop (retry.py)."""

    name: str  # the failure class: ErrorInfo reason (or status code name)[:http_status]
    retryable: bool
    retry_after_s: float | None = None
    message: str = ""
    outage: bool = False  # the service is unreachable: wait within the budget, attempts untouched
    budget_exhausted: bool = False  # set when an outage outlasted unavailable_budget_s
    #: What the row would have kept of an agent program's run (`ProgramRun.agent_program`), for the
    #: failures file; {} when no program ran.
    agent_program: dict[str, Any] = field(default_factory=dict)


class RolloutFailed(Exception):
    """Every attempt failed (or the first failed with a non-retryable error)."""

    def __init__(self, error: ErrorClass, attempts: int) -> None:
        super().__init__(f"{error.name}: {error.message}")
        self.error = error
        self.attempts = attempts


class NothingToReplay(mesh.InvalidArgument):
    """A stored rollout replayed through the agent loop (`replay.py`) ran out of recorded assistant
    turns before the loop did, or had none."""

    reason = "NOTHING_TO_REPLAY"


# -- external agent programs (program.py) --


class ProgramRun(Exception):
    """Base of the failures of an agent program that ran: `agent_program` is what a row keeps of
    the run (exit code or signal, seconds, the stdout and stderr tails ...), so the failures file
    keeps the same (program.py sets it; {} before the program ran)."""

    agent_program: dict[str, Any] = {}  # noqa: RUF012 - replaced per instance, never mutated


class AgentProgramExited(mesh.FailedPrecondition, ProgramRun):
    """The agent program exited non-zero (or was killed by a signal): nothing is verified."""

    reason = "AGENT_PROGRAM_EXITED"


class AgentProgramNoModelCall(mesh.FailedPrecondition, ProgramRun):
    """The agent program exited without one answered model call through its URL: no rollout."""

    reason = "AGENT_PROGRAM_NO_MODEL_CALL"


class AgentProgramTimedOut(mesh.DeadlineExceeded, ProgramRun):
    """The agent program ran past the rollout's deadline and was killed (retryable)."""

    reason = "AGENT_PROGRAM_TIMEOUT"


class AgentProgramUnstartable(mesh.FailedPrecondition, ProgramRun):
    """The agent program could not be started (no such file, not executable)."""

    reason = "AGENT_PROGRAM_UNSTARTABLE"


class AgentProgramUnsupported(mesh.FailedPrecondition):
    """The job's environment needs what an external program cannot give (it takes turns)."""

    reason = "AGENT_PROGRAM_UNSUPPORTED"


class AgentServerFailed(mesh.FailedPrecondition):
    """The job's agent server answered a rollout's /run with an error status or a body that is not
    `{"answer": ...}`, or dropped it while it kept running (drivers/agent_server.py): not retried."""

    reason = "AGENT_SERVER_FAILED"


class AgentServerDied(mesh.Unavailable):
    """The job's agent server died during the rollout, or before it was up (retried; the next
    rollout starts it again)."""

    reason = "AGENT_SERVER_DIED"
