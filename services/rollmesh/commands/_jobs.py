"""What `rollmesh jobs submit` and `rollmesh run` share: one set of job options, the JobSpec built
from them, and one submit-and-follow path (`submit_and_follow`: submit, say whether a job was
resumed, a live progress bar; Ctrl-C/SIGTERM cancels the job, what was written stays; a scheduler
that goes away is reported with the job id and the exact command that resumes it), how it ended
(`exit_for_job`: the state, its reason and the top failure classes on stderr, and the exit code of
_exit.py), and the final metrics table."""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import os
import shlex
import shutil
import signal
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import typer

from rollmesh.commands._common import as_dict
from rollmesh.commands._common import err
from rollmesh.commands._common import print_table
from rollmesh.commands._errors import SchedulerLost
from rollmesh.commands._exit import EXIT_ERROR
from rollmesh.commands._exit import EXIT_INTERRUPTED
from rollmesh.commands._exit import exit_code_for
from rollmesh.scheduler import DEFAULT_OUTPUT_DIR

if TYPE_CHECKING:
    from rollmesh_client import Client
    from rollmesh_client._scheduler import JobHandle
    from rollmesh_client.v1 import scheduler_pb2 as pb


def _option(default: Any, *decls: str, help: str) -> Any:
    """A SpecOptions field that `job_command` makes a flag of `run` and `jobs submit`."""
    return field(default=default, metadata={"option": typer.Option(default, *decls, help=help)})


@dataclass(frozen=True)
class SpecOptions:
    """The job options `run` and `jobs submit` share, declared once: every field but `model` (each
    command has its own --model) is a flag of both, in this order; `build_spec` makes the JobSpec."""

    benchmark: str = _option("", "--benchmark", "-b", help="Benchmark artifact (e.g. arithmetic).")
    dataset: str = _option(
        "",
        "--dataset",
        "-d",
        help="Dataset artifact name, or a path: NeMo Gym-format JSONL, a generator spec, a folder of Harbor"
        " tasks (needs --environment unless --benchmark names one).",
    )
    environment: str = _option("", "--environment", "-e", help="Environment name.")
    num_repeats: int = _option(
        0, "--num-repeats", "-n", help="Rollouts per task (k of pass@k; 0: the benchmark's, else 1)."
    )
    limit: int = _option(0, "--limit", help="Only the first N tasks (0 = all).")
    shard: str = _option("", "--shard", help="i/n: run shard i of n (task_index % n == i).")
    concurrency: int = _option(0, "--concurrency", "-c", help="Rollouts in flight (0 = auto).")
    max_steps: int = _option(0, "--max-steps", help="Model turns per rollout (0: the benchmark's, else 8).")
    agent_program: str = _option(
        "",
        "--agent-program",
        help="An external agent program (a command line) run once per rollout instead of the built-in "
        "loop, through a recorded OpenAI URL (docs/external-agents.md).",
    )
    oracle: bool = _option(
        False,
        "--oracle",
        help="Run each task's reference solution instead of a model, then verify (container tasks' "
        "solution/solve.sh, as Harbor's oracle agent): every task with one should score 1.",
    )
    agent_mode: str = _option(
        "command",
        "--agent-mode",
        help="How --agent-program runs: command (a process per rollout), warm (per rollout, forked from "
        "a Python interpreter with its imports done) or server (one agent server for the job, a /run "
        "request per rollout).",
    )
    temperature: float | None = _option(None, "--temperature", help="Sampling temperature.")
    top_p: float | None = _option(None, "--top-p", help="Nucleus sampling.")
    max_tokens: int | None = _option(None, "--max-tokens", help="Tokens per model turn.")
    logprobs: bool | None = _option(
        None,
        "--logprobs/--no-logprobs",
        help="Record the sampler's logprob of each generated token (tokens.logprobs; without it they are 0).",
    )
    starting_seed: int = _option(
        0, "--seed", "--starting-seed", help="Rollout i of a task samples with seed + i."
    )
    allowed_failures: str = _option(
        "",
        "--allowed-failures",
        help="Permanent rollout failures the job may have and still succeed: a count (5) or a "
        "percentage of its rollouts (1%). Default 0; above it the job ends COMPLETED_WITH_FAILURES (exit 3).",
    )
    max_attempts: int = _option(
        0, "--max-attempts", help="Attempts per rollout (0: default; `rollmesh config` lists it)."
    )
    rollout_timeout_s: float = _option(
        0.0, "--rollout-timeout", help="Seconds one attempt may take at most (0: default)."
    )
    unavailable_budget_s: float = _option(
        0.0,
        "--unavailable-budget",
        help="Seconds the gateway or verifier may stay unreachable before the job fails (0: default).",
    )
    fail_fast_after: int = _option(
        0,
        "--fail-fast-after",
        help="Fail the job at once when this many rollouts in a row fail with the same "
        "non-retryable error (0: default 20).",
    )
    replace_groups: str = _option(
        "",
        "--replace-groups",
        help="Keep batches full: hold each task's rollouts until all are in and replace a group with a "
        "failed rollout by a fresh one: next-task (the next task the job does not select) or same-task "
        "(new seeds). Default: replace nothing (docs/training.md).",
    )
    max_replacements: str = _option(
        "",
        "--max-replacements",
        help="With --replace-groups: the most groups replaced, a count (8) or a percentage of the job's "
        "tasks (25%). Default: as many as the job has tasks.",
    )
    sink_grpc: str = _option("", "--sink-grpc", help="host:port of a trainer's RolloutSink.")
    sink_ack_timeout_s: float = _option(
        0.0,
        "--sink-ack-timeout",
        help="Seconds the --sink-grpc trainer may acknowledge nothing while rollouts wait before the "
        "job fails (0: default; `rollmesh config` lists it). Set it above your longest optimizer step.",
    )
    sink_window: int = _option(
        0,
        "--sink-window",
        help="Rollouts the --sink-grpc trainer may hold unacknowledged (0: default 64); at least its "
        "batch size.",
    )
    output_dir: str = _option(
        "",
        "--output-dir",
        "-o",
        help=f"Where <job-id>/ folders go (default: the scheduler's results root, {DEFAULT_OUTPUT_DIR}/).",
    )
    resume_latest: bool = _option(
        False,
        "--resume",
        help="Finish the newest unfinished job with these settings (the scheduler looks in --output-dir); "
        "start a new one when there is none.",
    )
    job_id: str = _option(
        "",
        "--job-id",
        help="Resume exactly this job: its stored settings, only its missing rollouts "
        "(--concurrency and retry flags given here override).",
    )
    model: str = ""


_JOB_FIELDS = [f for f in fields(SpecOptions) if "option" in f.metadata]


def job_flags() -> dict[str, str]:
    """`SpecOptions` field -> the flag of `run` / `jobs submit` that sets it (e.g. "--max-attempts")."""
    return {
        f.name: next(d for d in f.metadata["option"].param_decls if d.startswith("--")) for f in _JOB_FIELDS
    }


def job_command(func: Callable[..., None]) -> Callable[..., None]:
    """Give a typer command the job options of `SpecOptions`; the command receives them as
    `job: SpecOptions`, after its own parameters."""
    own = inspect.signature(func, eval_str=True)
    types = typing.get_type_hints(SpecOptions)
    shared = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.metadata["option"], annotation=types[f.name]
        )
        for f in _JOB_FIELDS
    ]
    params = shared + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values()]
    params = [p for p in params if p.name != "job"]

    @functools.wraps(func)
    def command(**kwargs: Any) -> None:
        func(job=SpecOptions(**{f.name: kwargs.pop(f.name) for f in _JOB_FIELDS}), **kwargs)

    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    setattr(command, "__signature__", own.replace(parameters=params))  # noqa: B010 (typer reads it)
    return command


def build_spec(o: SpecOptions) -> pb.JobSpec:
    """The JobSpec for these flags; unset values stay unset so benchmark defaults apply."""
    from rollmesh.mesh.fields import to_pb
    from rollmesh_client.v1 import common_pb2
    from rollmesh_client.v1 import scheduler_pb2 as pb

    flags = job_flags()
    for name in (
        "num_repeats",
        "limit",
        "concurrency",
        "max_steps",
        "max_attempts",
        "rollout_timeout_s",
        "unavailable_budget_s",
        "fail_fast_after",
        "sink_ack_timeout_s",
        "sink_window",
    ):
        value = getattr(o, name)
        if not math.isfinite(value) or value < 0:  # typer parses "nan" and "inf" as floats
            raise typer.BadParameter(f"{flags[name]} must be >= 0, got {value}")
    for flag, value in (("--sink-ack-timeout", o.sink_ack_timeout_s), ("--sink-window", o.sink_window)):
        if value and not o.sink_grpc:
            raise typer.BadParameter(f"{flag} is the --sink-grpc trainer's: give --sink-grpc too")
    if o.job_id and o.resume_latest:
        raise typer.BadParameter("--resume finds the job to resume, --job-id names it: give one")
    shard = None
    if o.shard:
        idx, _, cnt = o.shard.partition("/")
        if not (idx.isdigit() and cnt.isdigit() and int(cnt) > 0):  # 0/0 ran the whole dataset
            raise typer.BadParameter(f"--shard {o.shard!r} is not i/n with n >= 1, e.g. 0/4")
        shard = pb.Shard(index=int(idx), count=int(cnt))
    allowed, allowed_fraction = parse_allowed_failures(o.allowed_failures) if o.allowed_failures else (0, 0.0)
    from rollmesh.scheduler.spec import REPLACE_MODES

    mode = o.replace_groups.replace("-", "_")
    if mode not in REPLACE_MODES:
        raise typer.BadParameter(f"--replace-groups {o.replace_groups!r} is not next-task or same-task")
    if o.max_replacements and not mode:
        raise typer.BadParameter("--max-replacements bounds --replace-groups: give --replace-groups too")
    replacements, replacement_fraction = (
        parse_allowed_failures(o.max_replacements, flag="--max-replacements")
        if o.max_replacements
        else (0, 0.0)
    )
    # Same-named options copy over; unset sampling options stay unset (the benchmark's apply).
    sampling = to_pb(common_pb2.SamplingParams, o)
    return to_pb(
        pb.JobSpec,
        o,
        dataset=_dataset(o),
        resume_job_id=o.job_id,
        shard=shard,
        agent=pb.AgentSpec(
            max_steps=o.max_steps,
            program=_argv(o.agent_program),
            oracle=o.oracle,
            program_mode=_agent_mode(o),
        ),
        retry=to_pb(pb.RetryPolicy, o),
        sampling=sampling if sampling.ByteSize() else None,
        sink=pb.SinkSpec(
            grpc=pb.GrpcSinkSpec(
                address=o.sink_grpc, ack_timeout_s=o.sink_ack_timeout_s, window=o.sink_window
            )
        )
        if o.sink_grpc
        else None,
        allowed_failures=allowed,
        allowed_failure_fraction=allowed_fraction,
        replace_groups=mode,
        max_replacements=replacements,
        max_replacement_fraction=replacement_fraction,
    )


def _dataset(o: SpecOptions) -> str:
    """--dataset as the scheduler takes it: a path that exists here made absolute (the scheduler's
    working folder is not this one), else the artifact name (or a path the scheduler sees) as given.
    Without --benchmark the job must name its environment: refused here, before anything starts."""
    if o.dataset and not (o.environment or o.benchmark or o.job_id or o.resume_latest):
        raise typer.BadParameter(
            f"--dataset {o.dataset!r} needs --environment (which environment verifies its rows?)"
        )
    return str(Path(o.dataset).resolve()) if o.dataset and Path(o.dataset).exists() else o.dataset


def _agent_mode(o: SpecOptions) -> str:
    """--agent-mode, checked here as the scheduler checks it (drivers/modes.py)."""
    from rollmesh.scheduler.drivers.modes import check_mode

    if o.agent_mode not in ("", "command") and not o.agent_program:
        raise typer.BadParameter(
            f"--agent-mode {o.agent_mode} runs --agent-program: give --agent-program too"
        )
    try:
        return check_mode(o.agent_mode, _argv(o.agent_program))
    except ValueError as exc:
        raise typer.BadParameter(f"--agent-mode {o.agent_mode}: {exc}") from None


def _argv(command: str) -> list[str]:
    """--agent-program's argv as it means here: the command found on this PATH (a pyenv shim: the
    interpreter it runs here, mesh/confine.py `resolve_shim`), and each argument naming an existing
    file made absolute (the scheduler runs the program in a folder of its own, with its own PATH)."""
    from rollmesh.mesh.confine import ShimUnresolved
    from rollmesh.mesh.confine import resolve_shim

    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise typer.BadParameter(f"--agent-program {command!r} is not a command line: {exc}") from None
    try:
        argv = resolve_shim(argv)
    except ShimUnresolved as exc:
        raise typer.BadParameter(f"--agent-program: {exc}") from None
    if argv and os.sep not in argv[0]:
        argv[0] = shutil.which(argv[0]) or argv[0]
    return [os.path.abspath(a) if not a.startswith("-") and Path(a).is_file() else a for a in argv]


def parse_allowed_failures(text: str, *, flag: str = "--allowed-failures") -> tuple[int, float]:
    """`--allowed-failures` (or `flag`): "5" -> (5, 0.0); "2.5%" -> (0, 0.025)."""
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
            f"{flag} {text!r} is not a count >= 0 (e.g. 5) or a percentage (e.g. 1%)"
        ) from None


SCHEDULER_LOST_AFTER_S = 15.0  # how long following tolerates an unreachable scheduler
WAITING_SAID_EVERY_S = 30.0


async def follow_job(handle: JobHandle, *, poll_s: float = 0.5) -> pb.Job:
    """A live progress line on stderr (done/total, rollouts/s, mean reward, failures: _progress.py)
    until the job ends; when stderr is not a terminal (no live line), what the job waits on is a
    line every WAITING_SAID_EVERY_S. Raises SchedulerLost when the scheduler is unreachable for
    SCHEDULER_LOST_AFTER_S."""
    import sys

    from rich.live import Live

    from rollmesh.commands._progress import JobProgressLine
    from rollmesh_client import RollmeshClientError
    from rollmesh_client._scheduler import FINAL_STATES

    line = JobProgressLine(handle.job_id)
    # While the services' output is captured (_quiet.py), sys.stdout and sys.stderr are their log:
    # Live must not copy what is written there onto the terminal.
    own_terminal = err.file is sys.stderr
    try:
        with Live(
            line,
            console=err,
            refresh_per_second=4,
            redirect_stdout=own_terminal,
            redirect_stderr=own_terminal,
        ) as live:
            unreachable_since: float | None = None
            said_at = float("-inf")
            while True:
                asked = time.monotonic()  # the SDK may have retried UNAVAILABLE for a while already
                try:
                    job = await handle.get()
                except RollmeshClientError as exc:
                    if exc.code.name != "UNAVAILABLE":
                        raise
                    unreachable_since = unreachable_since or asked
                    if time.monotonic() - unreachable_since >= SCHEDULER_LOST_AFTER_S:
                        raise SchedulerLost(handle.last, exc) from None
                    await asyncio.sleep(poll_s)
                    continue
                unreachable_since = None
                p = job.progress
                line.total = max(p.total - p.skipped_existing, 0)
                line.done, line.failed, line.stale = p.done, p.failed, p.stale_dropped
                line.replaced, line.short = p.groups_replaced, p.groups_short
                line.mean_reward, line.rollouts_per_second = p.mean_reward, p.rollouts_per_second
                line.waiting = p.waiting_on
                if (
                    p.waiting_on
                    and not err.is_terminal
                    and time.monotonic() - said_at >= WAITING_SAID_EVERY_S
                ):
                    said_at = time.monotonic()
                    err.print(f"{handle.job_id} waiting: {p.waiting_on}", markup=False, highlight=False)
                if job.state in FINAL_STATES:
                    line.ended = time.monotonic()
                    live.refresh()
                    return job
                await asyncio.sleep(poll_s)
    finally:
        if not err.is_terminal:  # Live leaves its last render without a newline off a terminal
            err.file.write("\n")


def resume_command(job: pb.Job, scheduler: str = "") -> str:
    """The exact command that finishes `job` (its missing rollouts only)."""
    parts = ["rollmesh", "run", "--job-id", job.job_id]
    output_dir = str(Path(job.output_path).parent) if job.output_path else job.spec.output_dir
    if output_dir:
        parts += ["--output-dir", output_dir]
    if scheduler:
        parts += ["--scheduler", scheduler]
    return shlex.join(parts)


@dataclass
class Followed:
    """How following a job ended."""

    job: pb.Job
    interrupted: bool = False  # Ctrl-C / SIGTERM here: the job was cancelled
    lost: bool = False  # the scheduler stopped answering: the job may have been interrupted
    metrics: pb.JobMetrics | None = None  # `rollmesh run` asks for them when the job ended here


async def submit_and_follow(
    client: Client,
    spec: pb.JobSpec,
    *,
    request_id: str = "",
    scheduler: str = "",
    on_submitted: Callable[[pb.Job], None] = lambda job: None,
) -> Followed:
    """Submit and follow (the module's contract); `scheduler`: the address given on the command
    line (it goes into the resume command); `on_submitted` hears the job once it exists."""
    handle = await client.scheduler.submit(spec, request_id=request_id)
    job = handle.last
    on_submitted(job)
    if spec.resume_latest:
        if job.spec.resume_job_id == job.job_id:
            err.print(f"resuming {job.job_id}")
        else:
            err.print("nothing to resume for these settings; starting a new job")
    err.print(f"job {job.job_id}: output in {job.output_path or '(the gRPC sink)'}")
    from rollmesh.mesh.aio import first_of

    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted.set)
    try:
        follower, _ = await first_of(follow_job(handle), interrupted.wait())
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if follower.cancelled():
        err.print(
            "interrupted: cancelling the job (everything written stays; rerun with --resume, or: "
            f"{resume_command(job, scheduler)})"
        )
        return Followed(await handle.cancel(), interrupted=True)
    try:
        return Followed(follower.result())
    except SchedulerLost as lost:
        err.print(
            f"[bold red]lost the scheduler[/] while following job {job.job_id} ({lost.cause}). "
            "Everything written is kept; if the job was interrupted, resume it with:\n"
            f"  {resume_command(lost.job, scheduler)}",
            highlight=False,
        )
        return Followed(lost.job, lost=True)


def exit_for_followed(followed: Followed, scheduler: str = "") -> None:
    """Exit with the code for how following ended (130 interrupted here, 1 scheduler lost, else the
    job's state); a job that did not succeed and can be resumed gets the resume command."""
    if followed.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if followed.lost:
        raise typer.Exit(EXIT_ERROR)
    if followed.job.resumable:
        err.print(f"resume with: {resume_command(followed.job, scheduler)}", highlight=False)
    exit_for_job(followed.job)


def show_failure_summary(job: pb.Job) -> None:
    """The top failure classes, most frequent first, with one example message each (stderr)."""
    if not job.failure_summary:
        return
    err.print(f"failures of {job.job_id} by class (top {len(job.failure_summary)}):", highlight=False)
    for f in job.failure_summary:
        err.print(f"  {f.count:>7}  {f.error_class}  e.g. {f.example_message}", highlight=False, markup=False)


def exit_for_job(job: pb.Job) -> None:
    """Print the job's outcome and exit with its code; return when it SUCCEEDED."""
    from rollmesh_client._scheduler import state_name

    state = state_name(job.state)
    code = exit_code_for(state)
    if state == "SUCCEEDED":
        if job.failure_summary:  # within --allowed-failures: say so, still success
            show_failure_summary(job)
        return
    err.print(f"[bold red]job {job.job_id} {state.lower()}[/]", highlight=False)
    if job.error:
        err.print(job.error, highlight=False, markup=False)
    show_failure_summary(job)
    raise typer.Exit(code)


def metrics_rows(
    m: pb.JobMetrics, job: pb.Job | None = None, *, duplicates: int = 0
) -> list[tuple[str, str]]:
    """The metrics table of `run`, `jobs submit --wait` and `aggregate` (which passes the keys it
    found twice as `duplicates`)."""
    rows = [
        ("rollouts", str(m.num_rollouts)),
        *([("  masked (left out of rewards)", str(m.num_masked))] if m.num_masked else []),
        *(
            [("  dropped as stale by the trainer", str(job.progress.stale_dropped))]
            if job and job.progress.stale_dropped
            else []
        ),
        ("tasks", str(m.num_tasks)),
        *(
            [
                ("failed groups replaced", str(job.progress.groups_replaced)),
                ("  not replaced (REPLACEMENTS_EXHAUSTED)", str(job.progress.groups_short)),
            ]
            if job and (job.progress.groups_replaced or job.progress.groups_short)
            else []
        ),
        ("failures", str(m.num_failures)),
        *[(f"  {name}", str(n)) for name, n in sorted(m.failures_by_class.items(), key=lambda kv: -kv[1])],
        *([("duplicates skipped", str(duplicates))] if duplicates else []),
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
    data = as_dict(m)
    data.pop("tasks", None)
    return data


def show_metrics(m: pb.JobMetrics, job: pb.Job | None = None) -> None:
    print_table(f"metrics {m.job_id}", ["metric", "value"], metrics_rows(m, job))
