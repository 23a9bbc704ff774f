"""`rollmesh serve scheduler` and `rollmesh jobs submit|status|list|cancel|stream`."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollmesh.commands._common import (
    ApiKey,
    Host,
    JsonOut,
    Port,
    SchedulerAddr,
    connect,
    print_json,
    print_table,
    run,
    serve_app,
)
from rollmesh.commands._jobs import (
    AllowedFailures,
    Benchmark,
    Concurrency,
    Environment,
    Followed,
    JobId,
    Limit,
    MaxAttempts,
    MaxSteps,
    MaxTokens,
    NumRepeats,
    OutputDir,
    Resume,
    RolloutTimeout,
    Seed,
    ShardOpt,
    SpecOptions,
    Temperature,
    TopP,
    UnavailableBudget,
    build_spec,
    exit_for_followed,
    resume_command,
    submit_and_follow,
)

if TYPE_CHECKING:
    from rollmesh_client.v1 import scheduler_pb2 as pb

jobs_app = typer.Typer(help="Submit, watch, list, cancel and stream rollout jobs.", no_args_is_help=True)


@serve_app.command("scheduler")
def serve_scheduler(
    port: Port = None,
    host: Host = None,
    output_dir: Annotated[
        str, typer.Option("--output-dir", help="Where JSONL sinks write <job_id>/.")
    ] = "runs",
) -> None:
    """Run the RolloutScheduler service (gateway and verifier from ROLLMESH_*_ADDR)."""
    from rollmesh.commands._common import fail
    from rollmesh.mesh.config import ConfigError
    from rollmesh.scheduler.__main__ import main

    try:
        main(port=port, host=host, output_dir=output_dir)
    except ConfigError as exc:
        fail(str(exc))


def _job_dict(job: pb.Job) -> dict[str, Any]:
    from google.protobuf import json_format

    data: dict[str, Any] = json_format.MessageToDict(job, preserving_proto_field_name=True)
    return data


def _show(job: pb.Job, as_json: bool, scheduler: str = "") -> None:
    from rollmesh_client._scheduler import state_name

    if as_json:
        print_json(_job_dict(job))
        return
    p = job.progress
    rows = [
        ("job_id", job.job_id),
        ("state", state_name(job.state)),
        ("progress", f"{p.done}/{p.total - p.skipped_existing} (+{p.skipped_existing} existing)"),
        ("succeeded / failed", f"{p.succeeded} / {p.failed}"),
        ("in flight", p.in_flight),
        ("mean reward", f"{p.mean_reward:.4f}"),
        ("rollouts/s", f"{p.rollouts_per_second:.1f}"),
        ("tokens/s", f"{p.tokens_per_second:.1f}"),
        ("retries", p.retries),
        ("output", job.output_path),
    ]
    if job.error:
        rows.append(("error", job.error))
    if job.resumable:
        rows.append(("resume", resume_command(job, scheduler)))
    print_table(f"job {job.job_id}", ["field", "value"], rows)


@jobs_app.command("submit")
def submit(
    benchmark: Benchmark = "",
    dataset: Annotated[
        str, typer.Option("--dataset", "-d", help="Dataset artifact name or JSONL path.")
    ] = "",
    environment: Environment = "",
    model: Annotated[str, typer.Option("--model", "-m", help="Model or gateway route.")] = "",
    num_repeats: NumRepeats = 0,
    limit: Limit = 0,
    shard: ShardOpt = "",
    concurrency: Concurrency = 0,
    max_steps: MaxSteps = 0,
    temperature: Temperature = None,
    top_p: TopP = None,
    max_tokens: MaxTokens = None,
    seed: Seed = 0,
    allowed_failures: AllowedFailures = "",
    max_attempts: MaxAttempts = 0,
    rollout_timeout: RolloutTimeout = 0.0,
    unavailable_budget: UnavailableBudget = 0.0,
    output_dir: OutputDir = "",
    resume: Resume = False,
    job_id: JobId = "",
    sink_grpc: Annotated[str, typer.Option("--sink-grpc", help="host:port of a trainer's RolloutSink.")] = "",
    request_id: Annotated[str, typer.Option("--request-id", help="Idempotency key.")] = "",
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the job ends.")] = False,
    scheduler: SchedulerAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """Submit a job (prints the job; with --wait, a progress bar, then the final state)."""
    spec = build_spec(
        SpecOptions(
            benchmark=benchmark,
            dataset=dataset,
            environment=environment,
            model=model,
            num_repeats=num_repeats,
            limit=limit,
            shard=shard,
            concurrency=concurrency,
            max_steps=max_steps,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            starting_seed=seed,
            output_dir=output_dir,
            sink_grpc=sink_grpc,
            max_attempts=max_attempts,
            rollout_timeout_s=rollout_timeout,
            unavailable_budget_s=unavailable_budget,
            job_id=job_id,
            resume_latest=resume,
            allowed_failures=allowed_failures,
        )
    )

    async def go() -> Followed:
        async with await connect(scheduler=scheduler, api_key=api_key) as c:
            if wait:
                return await submit_and_follow(c, spec, request_id=request_id, scheduler=scheduler)
            return Followed((await c.scheduler.submit(spec, request_id=request_id)).last)

    followed = run(go())
    _show(followed.job, as_json, scheduler)
    if wait:
        exit_for_followed(followed, scheduler)


@jobs_app.command("status")
def status(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    scheduler: SchedulerAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """A job's state and progress."""

    async def go() -> pb.Job:
        async with await connect(scheduler=scheduler, api_key=api_key) as c:
            return await c.scheduler.get(job_id)

    _show(run(go()), as_json, scheduler)


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
        print_json([_job_dict(j) for j in jobs])
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


@jobs_app.command("cancel")
def cancel(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    scheduler: SchedulerAddr = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """Stop a job; rollouts already written stay."""

    async def go() -> pb.Job:
        async with await connect(scheduler=scheduler, api_key=api_key) as c:
            return await c.scheduler.cancel(job_id)

    _show(run(go()), as_json, scheduler)


@jobs_app.command("stream")
def stream(
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    offset: Annotated[int, typer.Option("--offset", help="Skip the first N rollouts.")] = 0,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", help="Wait for new rollouts.")] = True,
    failures: Annotated[bool, typer.Option("--failures", help="Include failures at the end.")] = False,
    scheduler: SchedulerAddr = "",
    api_key: ApiKey = "",
) -> None:
    """The job's rollouts as JSON lines on stdout (offset included), following the job."""
    import json

    from google.protobuf import json_format

    async def go() -> None:
        async with await connect(scheduler=scheduler, api_key=api_key, timeout_s=None) as c:
            async for item in c.scheduler.stream(
                job_id, offset=offset, follow=follow, include_failures=failures
            ):
                data = json_format.MessageToDict(item, preserving_proto_field_name=True)
                data["offset"] = int(item.offset)
                sys.stdout.write(json.dumps(data) + "\n")
                sys.stdout.flush()

    run(go())


def register(app: typer.Typer) -> None:
    app.add_typer(jobs_app, name="jobs")
