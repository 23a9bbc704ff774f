"""The CLI's exit codes, in one place, so scripts can tell a job's outcome from a crash.

    0    the job SUCCEEDED (permanent failures within --allowed-failures), or the command did its work
    1    an error: a service unreachable or unreadable, an internal error, a crash
    2    bad usage or input (a flag, a spec the scheduler rejected, a missing file or artifact)
    3    the job COMPLETED_WITH_FAILURES: every rollout ran, more failed than allowed; `aggregate`:
         a job folder holds fewer rows than its job planned (metrics printed, but not that job's)
    4    the job FAILED (fail fast, every rollout failed, services gone for longer than the budget, sink)
    5    the job was CANCELLED (by `rollmesh jobs cancel` or another client)
    6    the job was INTERRUPTED (its scheduler stopped while it ran): resumable with --resume
    130  interrupted here (Ctrl-C / SIGTERM): the job was cancelled; rerun with --resume

Only the codes and what they mean live here (nothing printed: _jobs.py's `exit_for_job` prints a
job's outcome and exits with its code).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollmesh_client.v1 import scheduler_pb2 as pb

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_COMPLETED_WITH_FAILURES = 3
EXIT_JOB_FAILED = 4
EXIT_JOB_CANCELLED = 5
EXIT_JOB_INTERRUPTED = 6
EXIT_INTERRUPTED = 130

JOB_EXIT_CODES = {
    "SUCCEEDED": EXIT_OK,
    "COMPLETED_WITH_FAILURES": EXIT_COMPLETED_WITH_FAILURES,
    "FAILED": EXIT_JOB_FAILED,
    "CANCELLED": EXIT_JOB_CANCELLED,
    "INTERRUPTED": EXIT_JOB_INTERRUPTED,
}


def exit_code_for(state: str) -> int:
    """The exit code for a job's final state name (anything unknown is an error)."""
    return JOB_EXIT_CODES.get(state, EXIT_ERROR)


def failure_summary_dicts(job: pb.Job) -> list[dict[str, object]]:
    """For --json output."""
    return [
        {"error_class": f.error_class, "count": int(f.count), "example_message": f.example_message}
        for f in job.failure_summary
    ]
