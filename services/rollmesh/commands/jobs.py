"""`rollmesh jobs submit|status|list|cancel|stream`."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Annotated

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import SchedulerAddr
from rollmesh.commands._common import as_dict
from rollmesh.commands._common import connect
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run
from rollmesh.commands._jobs import Followed
from rollmesh.commands._jobs import SpecOptions
from rollmesh.commands._jobs import build_spec
from rollmesh.commands._jobs import exit_for_followed
from rollmesh.commands._jobs import job_command
from rollmesh.commands._jobs import resume_command
from rollmesh.commands._jobs import submit_and_follow

if TYPE_CHECKING:
    from rollmesh_client.v1 import scheduler_pb2 as pb

jobs_app = typer.Typer(help="Submit, watch, list, cancel and stream rollout jobs.", no_args_is_help=True)


def _show(job: pb.Job, as_json: bool, scheduler: str = "") -> None:
    from rollmesh_client._scheduler import state_name

    if as_json:
        print_json(as_dict(job))
        return
    p = job.progress
    rows = [
        ("job_id", job.job_id),
        ("state", state_name(job.state)),
        ("progress", f"{p.done}/{p.total - p.skipped_existing} (+{p.skipped_existing} existing)"),
        ("succeeded / failed", f"{p.succeeded} / {p.failed}"),
        *([("dropped as stale by the trainer", p.stale_dropped)] if p.stale_dropped else []),
        *([("failed groups replaced", p.groups_replaced)] if p.groups_replaced else []),
        *([("failed groups not replaced (bound used up)", p.groups_short)] if p.groups_short else []),
        ("in flight", p.in_flight),
        ("mean reward", f"{p.mean_reward:.4f}"),
        ("rollouts/s", f"{p.rollouts_per_second:.1f}"),
        ("tokens/s", f"{p.tokens_per_second:.1f}"),
        ("retries", p.retries),
        *([("waiting on", p.waiting_on)] if p.waiting_on else []),
        *([("model calls cut (hung)", p.model_calls_cut)] if p.model_calls_cut else []),
        ("output", job.output_path),
    ]
    if job.error:
        rows.append(("error", job.error))
    rows += [  # the top failure classes so far, with one example each
        (f"failed: {f.error_class}", f"{f.count} (e.g. {f.example_message})") for f in job.failure_summary
    ]
    if job.resumable:
        rows.append(("resume", resume_command(job, scheduler)))
    print_table(f"job {job.job_id}", ["field", "value"], rows)


@jobs_app.command("submit")
@job_command
def submit(
    job: SpecOptions,
    model: Annotated[str, typer.Option("--model", "-m", help="Model or gateway route.")] = "",
    request_id: Annotated[str, typer.Option("--request-id", help="Idempotency key.")] = "",
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the job ends.")] = False,
    scheduler: SchedulerAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """Submit a job (prints the job; with --wait, a progress bar, then the final state)."""
    spec = build_spec(replace(job, model=model))

    async def go() -> Followed:
        async with await connect(scheduler=scheduler, api_key=api_key) as c:
            if wait:
                return await submit_and_follow(c, spec, request_id=request_id, scheduler=scheduler)
            return Followed((await c.scheduler.submit(spec, request_id=request_id)).last)

    followed = run(go())
    _show(followed.job, as_json, scheduler)
    if wait:
        exit_for_followed(followed, scheduler)


JobIdArg = Annotated[str, typer.Argument(help="The job id.")]


def _one_job_command(name: str, action: str, doc: str) -> None:
    """`jobs <name>`: one SchedulerClient call (`action`) about one job, shown as a table (or JSON)."""

    def command(
        job_id: JobIdArg, scheduler: SchedulerAddr = "", api_key: ApiKey = "", as_json: JsonOut = False
    ) -> None:
        async def go() -> pb.Job:
            async with await connect(scheduler=scheduler, api_key=api_key) as c:
                job: pb.Job = await getattr(c.scheduler, action)(job_id)
                return job

        _show(run(go()), as_json, scheduler)

    command.__doc__ = doc
    jobs_app.command(name)(command)


_one_job_command(
    "status", "get", "A job's state and progress (and, when it can be resumed, the command that does it)."
)
_one_job_command("cancel", "cancel", "Stop a job; rollouts already written stay.")


@jobs_app.command("list")
def list_jobs(scheduler: SchedulerAddr = "", api_key: ApiKey = "", as_json: JsonOut = False) -> None:
    """Jobs of the scheduler, newest first: this run's and those found in its results root (a job its
    scheduler stopped while it ran is INTERRUPTED, its progress counted from disk; resume it)."""
    from rollmesh_client._scheduler import state_name

    async def go() -> list[pb.Job]:
        async with await connect(scheduler=scheduler, api_key=api_key) as c:
            return [j async for j in c.scheduler.jobs()]

    jobs = run(go())
    if as_json:
        print_json([as_dict(j) for j in jobs])
        return
    rows = [
        (
            j.job_id,
            state_name(j.state),
            f"{j.progress.done}/{j.progress.total}",
            f"{j.progress.mean_reward:.3f}",
            f"--job-id {j.job_id}" if j.resumable else "",
        )
        for j in jobs
    ]
    print_table("jobs", ["job_id", "state", "done", "mean reward", "resume with"], rows)


@jobs_app.command("stream")
def stream(
    job_id: JobIdArg,
    offset: Annotated[int, typer.Option("--offset", min=0, help="Skip the first N rollouts.")] = 0,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="Wait for new rollouts.")] = True,
    failures: Annotated[bool, typer.Option("--failures", help="Include failures at the end.")] = False,
    scheduler: SchedulerAddr = "",
    api_key: ApiKey = "",
) -> None:
    """The job's rollouts as JSON lines on stdout (offset included), following the job."""
    import json

    async def go() -> None:
        async with await connect(scheduler=scheduler, api_key=api_key, timeout_s=None) as c:
            async for item in c.scheduler.stream(
                job_id, offset=offset, follow=follow, include_failures=failures
            ):
                data = as_dict(item)
                data["offset"] = int(item.offset)
                sys.stdout.write(json.dumps(data) + "\n")
                sys.stdout.flush()

    run(go())


def register(app: typer.Typer) -> None:
    app.add_typer(jobs_app, name="jobs")
