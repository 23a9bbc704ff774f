"""What `rollmesh jobs submit` and `rollmesh run` share: the JobSpec built from flags, the live
progress bar, and the final metrics table."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rollmesh.commands._common import err, print_table

if TYPE_CHECKING:
    from rollmesh_client._scheduler import JobHandle
    from rollmesh_client.v1 import scheduler_pb2 as pb


# Options `rollmesh run` and `rollmesh jobs submit` share, declared once.
Benchmark = Annotated[str, typer.Option("--benchmark", "-b", help="Benchmark artifact (e.g. arithmetic).")]
Environment = Annotated[str, typer.Option("--environment", "-e", help="Environment name.")]
NumRepeats = Annotated[int, typer.Option("--num-repeats", "-n", help="Rollouts per task (k of pass@k).")]
Limit = Annotated[int, typer.Option("--limit", help="Only the first N tasks (0 = all).")]
ShardOpt = Annotated[str, typer.Option("--shard", help="i/n: run shard i of n (task_index % n == i).")]
Concurrency = Annotated[int, typer.Option("--concurrency", "-c", help="Rollouts in flight (0 = auto).")]
MaxSteps = Annotated[int, typer.Option("--max-steps", help="Model turns per rollout.")]
Temperature = Annotated[float | None, typer.Option("--temperature", help="Sampling temperature.")]
TopP = Annotated[float | None, typer.Option("--top-p", help="Nucleus sampling.")]
MaxTokens = Annotated[int | None, typer.Option("--max-tokens", help="Tokens per model turn.")]
Seed = Annotated[int, typer.Option("--seed", help="Rollout i of a task samples with seed + i.")]
AllowedFailures = Annotated[
    str,
    typer.Option(
        "--allowed-failures",
        help="Permanent rollout failures the job may have and still succeed: a count (5) or a "
        "percentage of its rollouts (1%). Default 0; above it the job ends COMPLETED_WITH_FAILURES (exit 3).",
    ),
]


@dataclass(frozen=True)
class SpecOptions:
    benchmark: str = ""
    dataset: str = ""
    environment: str = ""
    model: str = ""
    num_repeats: int = 0
    limit: int = 0
    shard: str = ""
    concurrency: int = 0
    max_steps: int = 0
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    starting_seed: int = 0
    output_dir: str = ""
    sink_grpc: str = ""
    max_attempts: int = 0
    resume: str = ""
    allowed_failures: str = ""


def build_spec(o: SpecOptions) -> pb.JobSpec:
    """The JobSpec for these flags; unset values stay unset so benchmark defaults apply."""
    from rollmesh_client.v1 import scheduler_pb2 as pb

    for name in ("num_repeats", "limit", "concurrency", "max_steps", "max_attempts"):
        if getattr(o, name) < 0:
            raise typer.BadParameter(f"--{name.replace('_', '-')} must be >= 0, got {getattr(o, name)}")
    spec = pb.JobSpec(
        benchmark=o.benchmark,
        dataset=o.dataset,
        environment=o.environment,
        model=o.model,
        num_repeats=o.num_repeats,
        limit=o.limit,
        concurrency=o.concurrency,
        starting_seed=o.starting_seed,
        output_dir=o.output_dir,
        resume_job_id=o.resume,
        agent=pb.AgentSpec(max_steps=o.max_steps),
        retry=pb.RetryPolicy(max_attempts=o.max_attempts),
    )
    if o.shard:
        idx, _, cnt = o.shard.partition("/")
        if not (idx.isdigit() and cnt.isdigit()):
            raise typer.BadParameter(f"--shard {o.shard!r} is not i/n, e.g. 0/4")
        spec.shard.CopyFrom(pb.Shard(index=int(idx), count=int(cnt)))
    if o.temperature is not None:
        spec.sampling.temperature = o.temperature
    if o.top_p is not None:
        spec.sampling.top_p = o.top_p
    if o.max_tokens is not None:
        spec.sampling.max_tokens = o.max_tokens
    if o.sink_grpc:
        spec.sink.grpc.address = o.sink_grpc
    if o.allowed_failures:
        spec.allowed_failures, spec.allowed_failure_fraction = parse_allowed_failures(o.allowed_failures)
    return spec


def parse_allowed_failures(text: str) -> tuple[int, float]:
    """`--allowed-failures`: "5" -> (5, 0.0); "2.5%" -> (0, 0.025)."""
    value = text.strip()
    try:
        if value.endswith("%"):
            pct = float(value[:-1])
            if not 0 <= pct <= 100:
                raise ValueError
            return 0, pct / 100
        count = int(value)
        if count < 0:
            raise ValueError
        return count, 0.0
    except ValueError:
        raise typer.BadParameter(
            f"--allowed-failures {text!r} is not a count >= 0 (e.g. 5) or a percentage (e.g. 1%)"
        ) from None


async def follow_job(handle: JobHandle, *, poll_s: float = 0.5) -> pb.Job:
    """A live progress bar on stderr (done/total, rollouts/s, mean reward, failures) until the job ends."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rollmesh_client._scheduler import FINAL_STATES

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rps]:.1f} rollouts/s"),
        TextColumn("reward {task.fields[reward]:.3f}  failed {task.fields[failed]}"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as bar:
        task = bar.add_task(handle.job_id, total=None, reward=0.0, rps=0.0, failed=0)
        while True:
            job = await handle.get()
            p = job.progress
            bar.update(
                task,
                total=max(p.total - p.skipped_existing, 0),
                completed=p.done,
                reward=p.mean_reward,
                rps=p.rollouts_per_second,
                failed=p.failed,
            )
            if job.state in FINAL_STATES:
                return job
            await asyncio.sleep(poll_s)


def exit_for_state(job: pb.Job) -> None:
    """Print a job's outcome and exit with its code (commands/_exit.py); return when it SUCCEEDED."""
    from rollmesh.commands._exit import exit_for_job

    exit_for_job(job)


def metrics_rows(m: pb.JobMetrics, job: pb.Job | None = None) -> list[tuple[str, str]]:
    rows = [
        ("rollouts", str(m.num_rollouts)),
        ("tasks", str(m.num_tasks)),
        ("failures", str(m.num_failures)),
        *[(f"  {name}", str(n)) for name, n in sorted(m.failures_by_class.items(), key=lambda kv: -kv[1])],
        ("mean reward", f"{m.mean_reward:.4f} ± {m.stderr_reward:.4f} (stderr)"),
        ("pass@1 (avg over k)", f"{m.pass_at_1_avg:.4f}"),
    ]
    rows += [(f"pass@{k}", f"{m.pass_at_k[k]:.4f}") for k in sorted(m.pass_at_k)]
    rows += [(f"maj@{k}", f"{m.maj_at_k[k]:.4f}") for k in sorted(m.maj_at_k)]
    rows.append(
        ("mean tokens (prompt / completion)", f"{m.mean_prompt_tokens:.1f} / {m.mean_completion_tokens:.1f}")
    )
    if job is not None:
        rows.append(("tokens/s", f"{job.progress.tokens_per_second:.1f}"))
        rows.append(("rollouts/s", f"{job.progress.rollouts_per_second:.1f}"))
    return rows


def metrics_dict(m: pb.JobMetrics) -> dict[str, Any]:
    from google.protobuf import json_format

    data: dict[str, Any] = json_format.MessageToDict(m, preserving_proto_field_name=True)
    data.pop("tasks", None)
    return data


def show_metrics(m: pb.JobMetrics, job: pb.Job | None = None) -> None:
    print_table(f"metrics {m.job_id}", ["metric", "value"], metrics_rows(m, job))
