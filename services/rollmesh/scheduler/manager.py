"""Jobs: submit (validated before anything runs, idempotent by request_id; `resume_latest` finds
the job to resume in the results root), get, list, cancel, stream the output, metrics. Each job's
state is persisted as `<output_dir>/<job_id>/job.json` beside the sink files (layout and reading:
`scheduler/store.py`), so a restarted scheduler lists it (one that was running as INTERRUPTED,
its progress counted from its files) and resumes it by id. A sink that cannot store a row fails
the job at once, and the final progress counts only rows that reached the disk.
No grpc here: the servicer converts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import time
import uuid
from collections.abc import AsyncIterator
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from pathlib import Path

from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.errors import InvalidArgument
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.errors import Unavailable
from rollmesh.mesh.logging import get_logger
from rollmesh.registry import Catalog
from rollmesh.scheduler import DEFAULT_OUTPUT_DIR
from rollmesh.scheduler import store
from rollmesh.scheduler import telemetry
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.drivers.agent_loop import EnvPort
from rollmesh.scheduler.drivers.agent_loop import ModelPort
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.engine import Progress
from rollmesh.scheduler.engine import RunResult
from rollmesh.scheduler.errors import CorruptJobFile
from rollmesh.scheduler.errors import JobFinished
from rollmesh.scheduler.errors import JobNotFound
from rollmesh.scheduler.errors import JobRunning
from rollmesh.scheduler.errors import OffsetExpired
from rollmesh.scheduler.errors import OutputDirUnusable
from rollmesh.scheduler.errors import RequestIdReused
from rollmesh.scheduler.errors import ResumeMismatch
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.outcome import COMPLETED_WITH_FAILURES
from rollmesh.scheduler.outcome import FINAL_STATES
from rollmesh.scheduler.outcome import INTERRUPTED
from rollmesh.scheduler.outcome import SUCCEEDED
from rollmesh.scheduler.outcome import FailureClassSummary
from rollmesh.scheduler.plan import Plan
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.plan import refuse_promptless
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.sinks.base import Sink
from rollmesh.scheduler.sinks.jsonl import JsonlSink
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import validate
from rollmesh.verifier.errors import EnvironmentBroken
from rollmesh.verifier.errors import EnvironmentNotFound

log = get_logger("rollmesh.scheduler.jobs")

RING_SIZE = 2048  # recent output items kept in memory for StreamRollouts
MAX_JOBS = 1000  # jobs kept in memory; the oldest finished ones are forgotten first
READ_BATCH = 256
TIME_LIMIT = 62135596800.0  # |seconds| a protobuf Timestamp holds on both sides of 1970
CAPACITY_TIMEOUT_S = 5.0  # asking the gateway what its engines run at once (automatic concurrency)
# The Progress fields job.json keeps.
STORED_PROGRESS = tuple(
    (
        "total done succeeded failed skipped_existing stale_dropped masked mean_reward retries "
        "groups_replaced groups_short"
    ).split()
)

SinkFactory = Callable[[str, Plan, Path], Sink]
Item = Rollout | RolloutFailure


def default_sink_factory(job_id: str, plan: Plan, directory: Path, *, api_key: str = "") -> Sink:
    """JSONL (default) under `<output_dir>/<job_id>/`, or the trainer's gRPC RolloutSink (called with
    `api_key`, the mesh's own, as a bearer token when set)."""
    cfg = plan.spec.sink
    if cfg.kind == "grpc":
        from rollmesh.scheduler.sinks.grpc import GrpcSink

        return GrpcSink(
            cfg.address,
            window=cfg.window or 64,
            api_key=api_key or None,
            ack_timeout_s=cfg.ack_timeout_s or None,
        )
    return JsonlSink(directory, fsync_every=cfg.fsync_every or 64, k_values=list(plan.k_values))


@dataclass
class JobRecord:
    job_id: str
    request_id: str
    spec: JobSpec  # as submitted (what job.json keeps)
    directory: Path
    create_time: float
    state: str = "PENDING"
    error: str = ""
    end_time: float | None = None
    plan: Plan | None = None
    run: JobRun | None = None
    has_file: bool = False  # the sink writes rollouts.jsonl in `directory`
    stored_progress: Json = field(default_factory=dict)
    on_disk: store.OnDisk | None = None  # rows counted in the folder (a job read back from job.json)
    stored_failure_summary: list[FailureClassSummary] = field(default_factory=list)
    # Output log: offsets [next_offset - len(ring), next_offset) are in memory; earlier ones in the file.
    ring: collections.deque[Rollout] = field(default_factory=lambda: collections.deque(maxlen=RING_SIZE))
    next_offset: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def finished(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def progress(self) -> Progress:
        if self.run is not None:
            return self.run.progress_now(finished=self.finished)
        sp, p = self.stored_progress, Progress()
        for name in STORED_PROGRESS:
            if name != "mean_reward":  # a property, of reward_sum
                setattr(p, name, int(sp.get(name, 0)))
        p.reward_sum = float(sp.get("mean_reward", 0.0)) * max(p.succeeded - p.masked, 0)
        if self.on_disk is not None:  # what the files hold is the truth, whatever job.json last said
            d = self.on_disk
            p.done, p.succeeded, p.failed, p.reward_sum = d.done, d.rollouts, d.failures, d.reward_sum
            p.masked = d.masked
            p.skipped_existing = 0  # the files' rollouts include them
        return p

    @property
    def resumable(self) -> bool:
        """Ended without succeeding and keeps a folder to resume from."""
        return self.finished and self.state != SUCCEEDED and self.has_file

    @property
    def failure_summary(self) -> list[FailureClassSummary]:
        """The top failure classes of the run, with counts and one example message each."""
        return self.run.tally.summary() if self.run is not None else self.stored_failure_summary

    def notify(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def to_json(self) -> Json:
        p = self.progress
        return {
            "job_id": self.job_id,
            "request_id": self.request_id,
            "spec": self.spec.to_json(),
            "state": self.state,
            "error": self.error,
            "create_time": self.create_time,
            "end_time": self.end_time,
            "progress": {k: getattr(p, k) for k in STORED_PROGRESS},
            "failure_summary": [f.to_json() for f in self.failure_summary],
        }


def _check_same_rollouts(job_id: str, stored: JobSpec, asked: JobSpec) -> None:
    """Refuse to resume `job_id` (which ran `stored`) with settings `asked` that name other rollouts."""
    theirs, mine = store.identity(stored), store.identity(asked)
    differ = [k for k in store.IDENTITY_FIELDS if theirs[k] != mine[k]]
    if differ:
        what = "; ".join(f"{k}: {theirs[k]!r} there, {mine[k]!r} here" for k in differ)
        raise ResumeMismatch(
            f"job {job_id} ran other rollouts than these settings ask for ({what}). Resume it with its "
            f"own settings (`rollmesh run --job-id {job_id} --output-dir {asked.effective_output_dir}` "
            "and no dataset flags), or start a new job without --job-id",
            metadata={"job_id": job_id, "fields": ",".join(differ)},
        )


async def _check_same_tasks(job_id: str, plan: Plan) -> None:
    """Refuse to resume `job_id` when its stored rollouts echo other tasks than the dataset now
    holds at their indices (the file changed under the same path): the job's metrics would pair
    old rewards with new tasks."""
    rollouts = Path(plan.spec.effective_output_dir) / job_id / store.ROLLOUTS
    changed = await asyncio.to_thread(store.changed_tasks, rollouts, plan.rows)
    if changed:
        raise ResumeMismatch(
            f"job {job_id} has rollouts of other tasks than {plan.dataset_path} now holds at indices "
            f"{', '.join(map(str, changed))}: the dataset changed since the job ran. Restore it, or start "
            "a new job without --job-id",
            metadata={"job_id": job_id, "fields": "dataset"},
        )


def _stored_spec(path: Path, stored: Json) -> JobSpec:
    try:
        return JobSpec.from_json(stored.get("spec") or {})
    except (TypeError, ValueError, AttributeError) as exc:
        raise CorruptJobFile(f"{path}: spec: {exc}") from None


def _stored_number(data: Json, name: str, limit: float) -> float | None:
    """`data[name]` when a number of magnitude below `limit`, None when absent; else ValueError."""
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) < limit:
        raise ValueError(f"{name} is {value!r:.60}, not a number of magnitude below {limit:g}")
    return value


def stored_metrics(run: JobRun, job_id: str) -> Json:
    """A job's metrics over the rollouts its sink holds: those it buffers, lost or was never
    acknowledged (`Sink.not_stored`) are left out (a disk that filled mid-job counted them)."""
    unstored = run.sink.not_stored()
    scored = [s for s in run.scored if s.key not in unstored] if unstored else run.scored
    return {
        **compute(
            scored,
            run.failures,
            k_values=list(run.plan.k_values),
            job_id=job_id,
            sink_writes=run.sink.write_times,
        ).to_json(),
        **run.refill_figures(),
    }


def resume_hint(job_id: str, output_dir: str | Path) -> str:
    """How a user resumes a job, in CLI flags (the API field is JobSpec.resume_job_id)."""
    return f"resume it with `rollmesh run --job-id {job_id} --output-dir {output_dir}`"


class JobManager:
    """Every job of this scheduler process."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        model: ModelPort,
        env: EnvPort,
        output_dir: str = DEFAULT_OUTPUT_DIR,
        sink_factory: SinkFactory | None = None,
        api_key: str = "",
    ) -> None:
        self.catalog = catalog
        self.model = model
        self.env = env
        self.output_dir = output_dir
        self._cwd = os.getcwd()
        self.sink_factory = sink_factory or functools.partial(default_sink_factory, api_key=api_key)
        self._jobs: dict[str, JobRecord] = {}
        self._by_request: dict[str, str] = {}
        self._tasks = TaskSet()
        self._submit_lock = asyncio.Lock()
        self._disk_counts: dict[Path, tuple[tuple[int, ...], store.OnDisk]] = {}
        telemetry.LIVE.watch(self.live_jobs)  # jobs by state, in flight, concurrency: read at scrape time

    def live_jobs(self) -> list[telemetry.JobNow]:
        """The jobs held in memory now, as a metrics scrape reads them (on the endpoint's thread:
        copies only)."""
        jobs = []
        for rec in list(self._jobs.values()):
            run = rec.run
            if run is None or rec.finished:
                jobs.append(telemetry.JobNow(rec.state))
                continue
            waiting = (*run.outages.down, *(("sink",) if run.sink.waiting() else ()))
            jobs.append(telemetry.JobNow(rec.state, True, run.in_flight, run.limiter.limit, waiting))
        return jobs

    # ---- submit -------------------------------------------------------------------------------

    async def submit(self, spec: JobSpec, request_id: str = "") -> JobRecord:
        # The server's output folder is the default; paths are absolute so callers elsewhere can use them.
        spec = replace(spec, output_dir=os.path.join(self._cwd, spec.output_dir or self.output_dir))
        async with self._submit_lock:
            if request_id and request_id in self._by_request:
                rec = self._jobs.get(self._by_request[request_id])
                if rec is not None:
                    if rec.spec != spec:
                        raise RequestIdReused(
                            f"request_id {request_id!r} already started job {rec.job_id} with another spec",
                            metadata={"job_id": rec.job_id},
                        )
                    return rec
            validate(spec)
            job_id, spec = await self._resolve_resume(spec)
            plan = await asyncio.to_thread(build_plan, self.catalog, spec)
            if spec.resume_job_id and plan.spec.sink.kind == "jsonl":
                await _check_same_tasks(job_id, plan)
            described = await self._check_environment(plan.spec.environment)
            if described.stateless:  # it opens no session for such a row: nothing can give its prompt
                refuse_promptless(plan)
            capacity = await self._engine_capacity(plan.spec.model) if not plan.spec.concurrency else 0
            directory = Path(plan.spec.effective_output_dir) / job_id
            sink = self.sink_factory(job_id, plan, directory)
            rec = JobRecord(
                job_id=job_id,
                request_id=request_id,
                spec=spec,
                directory=directory,
                create_time=time.time(),
                plan=plan,
                has_file=plan.spec.sink.kind == "jsonl",
            )
            hooks = Hooks()
            hooks.on_rollout = lambda r: self._on_rollout(rec, r)
            hooks.on_failure = lambda f: rec.notify()
            rec.run = JobRun(
                job_id,
                plan,
                sink,
                model=self.model,
                env=self.env,
                hooks=hooks,
                environment=described,
                engine_capacity=capacity,
            )
            rec.run.keep_scored = not rec.has_file
            run = rec.run
            sink.on_error = lambda exc: run.stop(RunResult("FAILED", exc.message))
            try:
                await asyncio.to_thread(store.write_json_atomic, directory / store.JOB, rec.to_json())
            except OSError as exc:  # a file where the folder goes, no permission, a full disk
                raise OutputDirUnusable(
                    f"cannot write the job folder {directory}: {exc.strerror or exc} (check --output-dir)",
                    metadata={"path": str(directory)},
                ) from None
            self._remember(rec)
            self._tasks.spawn(self._drive(rec), name=f"job-{job_id}")
            log.info("job_submitted", job_id=job_id, total=plan.total, environment=plan.spec.environment)
            return rec

    async def _resolve_resume(self, spec: JobSpec) -> tuple[str, JobSpec]:
        if spec.resume_latest:
            found = await asyncio.to_thread(store.find_resumable, Path(spec.effective_output_dir), spec)
            spec = replace(spec, resume_latest=False, resume_job_id=found or "")
            log.info("resume_latest", found=found or "", output_dir=spec.effective_output_dir)
        if not spec.resume_job_id:
            return f"job-{uuid.uuid4().hex[:12]}", spec
        job_id = spec.resume_job_id
        running = self._jobs.get(job_id)
        if running is not None and not running.finished:
            raise JobRunning(
                f"job {job_id} is still running here; `rollmesh jobs cancel {job_id}` before resuming it",
                metadata={"job_id": job_id},
            )
        stored_path = Path(spec.effective_output_dir) / job_id / store.JOB
        stored = await asyncio.to_thread(store.read_json, stored_path)
        if spec.dataset or spec.benchmark:
            if stored is not None:
                _check_same_rollouts(job_id, _stored_spec(stored_path, stored), spec)
            return job_id, spec
        if stored is None:
            raise JobNotFound(
                f"no job {job_id} to resume in {spec.effective_output_dir!r} (no {store.JOB}); "
                "give --output-dir the folder it ran with (or the job's full flags)",
                metadata={"job_id": job_id},
            )
        base = _stored_spec(stored_path, stored)
        return job_id, replace(
            base,
            resume_job_id=job_id,
            output_dir=spec.output_dir or base.output_dir,
            concurrency=spec.concurrency or base.concurrency,
            retry=spec.retry if spec.retry != JobSpec().retry else base.retry,
        )

    async def _engine_capacity(self, model: str) -> int:
        """What the model's engines run at once, for automatic concurrency: a hint, so a gateway that
        cannot say (or does not answer in time) gives 0, and the limit starts small as without one."""
        try:
            async with asyncio.timeout(CAPACITY_TIMEOUT_S):
                capacity = await self.model.engine_capacity(model)
        except Exception as exc:
            log.warning("engine_capacity_unknown", model=model, error=str(exc) or type(exc).__name__)
            return 0
        log.info("engine_capacity", model=model, requests=capacity)
        return max(0, capacity)

    async def _check_environment(self, name: str) -> EnvDescription:
        """The environment's description (once per job); a clear error when it is not loaded."""
        try:
            return await self.env.describe_environment(name)
        except Exception as exc:
            code = getattr(getattr(exc, "code", None), "name", "")  # a RollmeshError's or the SDK's
            if code == "NOT_FOUND":
                raise EnvironmentNotFound(
                    f"environment {name!r} is not loaded in the verifier: {getattr(exc, 'message', exc)}",
                    metadata={"environment": name},
                ) from None
            if code == "FAILED_PRECONDITION":  # loaded but unusable (a broken plugin, a name collision)
                raise EnvironmentBroken(
                    f"environment {name!r} cannot be used: {getattr(exc, 'message', exc)}",
                    metadata={"environment": name, "cause": str(getattr(exc, "reason", ""))},
                ) from None
            raise Unavailable(f"cannot reach the verifier to check environment {name!r}: {exc}") from None

    def _remember(self, rec: JobRecord) -> None:
        self._jobs[rec.job_id] = rec
        if rec.request_id:
            self._by_request[rec.request_id] = rec.job_id
        if len(self._jobs) > MAX_JOBS:
            for old in sorted(self._jobs.values(), key=lambda r: r.create_time):
                if len(self._jobs) <= MAX_JOBS:
                    break
                if old.finished:
                    del self._jobs[old.job_id]
                    self._by_request.pop(old.request_id, None)

    def _on_rollout(self, rec: JobRecord, rollout: Rollout) -> None:
        rec.ring.append(rollout)
        rec.next_offset += 1
        rec.notify()

    # ---- running ------------------------------------------------------------------------------

    async def _drive(self, rec: JobRecord) -> None:
        run = rec.run
        assert run is not None
        result = RunResult("FAILED", "internal error")
        try:
            existing = await run.open()
            rec.next_offset = len(existing)
            rec.state = "RUNNING"
            rec.notify()
            await asyncio.to_thread(store.write_json_atomic, rec.directory / store.JOB, rec.to_json())
            result = await run.run(existing)
        except asyncio.CancelledError:
            result = RunResult(
                "CANCELLED",
                "the scheduler stopped while the job ran; "
                + resume_hint(rec.job_id, rec.spec.effective_output_dir),
            )
            raise
        except RollmeshError as exc:  # a named failure (a sink that cannot be reached): its message says it
            log.info("job_failed", job_id=rec.job_id, reason=exc.reason, error=exc.message)
            result = RunResult("FAILED", exc.message)
        except Exception as exc:  # a bug: the traceback is the log's
            log.error("job_error", job_id=rec.job_id, exc_info=exc)
            result = RunResult("FAILED", f"{type(exc).__name__}: {exc}")
        finally:
            await self._finish(rec, result)

    async def _finish(self, rec: JobRecord, result: RunResult) -> None:
        run = rec.run
        assert run is not None
        # A JSONL sink counts its own folder; any other sink is asked once it knows what it stored.
        metrics = None if rec.has_file else lambda: stored_metrics(run, rec.job_id)
        run.sink.extra_metrics = run.refill_figures()
        try:
            await run.sink.close(state=result.state, metrics=metrics)
        except Exception as exc:
            log.error("sink_close_failed", job_id=rec.job_id, exc_info=exc)
            if result.state in (SUCCEEDED, COMPLETED_WITH_FAILURES):
                result = RunResult("FAILED", f"the sink failed to close: {exc}")
        sink_error = getattr(run.sink, "error", None)
        if isinstance(sink_error, RollmeshError) and result.state != "FAILED":
            result = RunResult("FAILED", sink_error.message)
        if isinstance(run.sink, JsonlSink):  # progress counts what reached the disk, not what was handed over
            p = run.progress
            # (the replaced groups' rollouts are in failures.jsonl, not the job's failures: refill.py)
            p.succeeded, p.failed = (
                run.sink.rows_written,
                max(run.sink.failures_written - p.replaced_rollouts, 0),
            )
            p.done, p.reward_sum = p.succeeded + p.failed, run.sink.reward_written
            p.masked = run.sink.masked_written
        final = (result.state, result.error, time.time())
        # job.json gets the final state before GetJob can report it: a client that sees the job
        # ended finds the folder saying the same.
        job_json = replace(rec, state=final[0], error=final[1], end_time=final[2]).to_json()
        p = run.progress
        log.info(
            "job_finished",
            job_id=rec.job_id,
            state=final[0],
            error=final[1],
            done=p.done,
            failed=p.failed,
            skipped=p.skipped_existing,
            stale_dropped=p.stale_dropped,
            mean_reward=round(p.mean_reward, 4),
        )
        try:
            if not isinstance(run.sink, JsonlSink) or run.sink.owned_folder:  # else another run's job.json
                await asyncio.to_thread(store.write_json_atomic, rec.directory / store.JOB, job_json)
        except OSError as exc:  # job.json keeps its last state (a restart lists the job as interrupted)
            log.error("job_state_not_persisted", job_id=rec.job_id, state=final[0], error=str(exc))
        finally:
            rec.state, rec.error, rec.end_time = final
        rec.notify()
        rec.done.set()

    async def wait(self, job_id: str) -> JobRecord:
        rec = await self.get(job_id)
        await rec.done.wait()
        return rec

    async def cancel(self, job_id: str) -> JobRecord:
        rec = await self.get(job_id)
        if rec.finished or rec.run is None:
            raise JobFinished(f"job {job_id} already ended ({rec.state})", metadata={"job_id": job_id})
        rec.run.stop(RunResult("CANCELLED", "cancelled by request"))
        await rec.done.wait()
        return rec

    async def aclose(self) -> None:
        await self._tasks.aclose()

    # ---- reading ------------------------------------------------------------------------------

    @property
    def results_root(self) -> Path:
        """Where this scheduler's jobs live by default (`--output-dir` of `serve scheduler`)."""
        return Path(self._cwd) / self.output_dir

    async def get(self, job_id: str) -> JobRecord:
        rec = self._jobs.get(job_id)
        if rec is not None:
            return rec
        if store.is_job_id(job_id):
            directory = store.job_dir(self.results_root, job_id)
            stored = await asyncio.to_thread(store.read_json, directory / store.JOB)
            if stored is not None:
                return await asyncio.to_thread(self._from_disk, directory, stored)
        raise JobNotFound(
            f"no job {job_id!r} in this scheduler or in {str(self.results_root)!r}",
            metadata={"job_id": job_id},
        )

    def _from_disk(self, directory: Path, stored: Json) -> JobRecord:
        """A job of an earlier scheduler process, from its job.json, its progress counted from its
        files (blocking: call from a thread). A field of the wrong type raises CorruptJobFile."""
        try:
            spec = _stored_spec(directory / store.JOB, stored)
            progress = stored.get("progress", {})
            rec = JobRecord(
                job_id=str(stored.get("job_id", directory.name)),
                request_id=str(stored.get("request_id", "")),
                spec=spec,
                directory=directory,
                create_time=_stored_number(stored, "create_time", TIME_LIMIT) or 0.0,
                state=str(stored.get("state", "FAILED")),
                error=str(stored.get("error", "")),
                end_time=_stored_number(stored, "end_time", TIME_LIMIT),
                has_file=spec.sink.kind == "jsonl",
                stored_progress={k: _stored_number(progress, k, 2**63) or 0 for k in dict(progress)},
                stored_failure_summary=[
                    FailureClassSummary.from_json(f) for f in stored.get("failure_summary", [])
                ],
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise CorruptJobFile(f"{directory / store.JOB}: {exc}") from None
        if rec.has_file:
            rec.on_disk = self._count(directory)
        if not rec.finished:  # it was running when its scheduler died
            rec.state = INTERRUPTED
            rec.error = "interrupted: the scheduler running it stopped; " + resume_hint(
                rec.job_id, directory.parent
            )
        rec.done.set()
        return rec

    def _count(self, directory: Path) -> store.OnDisk | None:
        """Rows in a job folder, recounted only when its files changed (size, mtime)."""
        stamp = store.files_stamp(directory)
        cached = self._disk_counts.get(directory)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            counted = store.count_on_disk(directory)
        except (OSError, ValueError, KeyError, TypeError, OverflowError, RollmeshError) as exc:
            log.warning("job_folder_unreadable", directory=str(directory), error=str(exc))
            return None
        self._disk_counts[directory] = (stamp, counted)
        return counted

    async def list_jobs(self) -> list[JobRecord]:
        """Jobs in memory and jobs of earlier scheduler processes found in the results root
        (interrupted ones included, progress counted from disk), newest first."""
        from_disk = await asyncio.to_thread(self._stored_jobs)
        jobs = {**{r.job_id: r for r in from_disk}, **self._jobs}
        return sorted(jobs.values(), key=lambda r: r.create_time, reverse=True)

    def _stored_jobs(self) -> list[JobRecord]:
        """Every job under the results root this process does not hold; a corrupt job.json is logged
        and left out, never failing the listing of the others."""
        jobs = []
        for folder, stored in store.stored_jobs(self.results_root):
            if str(stored.get("job_id", folder.name)) not in self._jobs:
                try:
                    jobs.append(self._from_disk(folder, stored))
                except CorruptJobFile as exc:
                    log.warning("job_file_corrupt", error=exc.message)
        return jobs

    async def metrics(self, job_id: str, *, from_file: bool = True) -> Json:
        """The job's metrics: its metrics.json once it ended (unless not `from_file`), else counted now."""
        rec = await self.get(job_id)
        ended = rec.finished and rec.has_file and rec.state != INTERRUPTED  # an interrupted run wrote none
        if from_file and ended:
            stored = await asyncio.to_thread(store.read_json, rec.directory / store.METRICS)
            if stored is not None:
                return stored
        if rec.has_file:  # what is on disk: never the ring, which holds rows handed to the sink
            rollouts, failures = await asyncio.to_thread(store.load_scored, rec.directory)
            k_values = list(rec.plan.k_values) if rec.plan else None
            return compute(rollouts, failures, k_values=k_values, job_id=job_id).to_json()
        run = rec.run
        if run is None:
            return compute([], [], job_id=job_id).to_json()
        return stored_metrics(run, job_id)

    async def stream(
        self, job_id: str, *, offset: int = 0, follow: bool = False, include_failures: bool = False
    ) -> AsyncIterator[tuple[int, Item]]:
        """The job's rollouts in written order from `offset` (offsets count rollouts.jsonl lines); with
        `follow`, until the job ends. With `include_failures`, the failures follow once the job has
        ended, numbered after the last rollout."""
        if offset < 0:
            raise InvalidArgument(f"offset must be 0 or more, got {offset}")
        rec = await self.get(job_id)
        path = rec.directory / store.ROLLOUTS
        pos = offset
        byte_pos, cursor_line = 0, 0
        if rec.has_file:
            byte_pos, cursor_line = await asyncio.to_thread(store.skip_lines, path, pos)
        while True:
            changed = rec.changed
            ring_start = rec.next_offset - len(rec.ring)
            if ring_start <= pos < rec.next_offset:
                yield pos, rec.ring[pos - ring_start]
                pos += 1
                continue
            if pos < ring_start or (rec.run is None and rec.has_file):
                if not rec.has_file:
                    raise OffsetExpired(
                        f"offset {pos} is older than the {RING_SIZE} rollouts kept in memory and the sink "
                        "keeps no file; stream from a later offset",
                        metadata={"oldest_offset": str(ring_start)},
                    )
                if cursor_line < pos:  # the file was behind when we started: catch up
                    byte_pos, n = await asyncio.to_thread(store.skip_lines, path, pos - cursor_line, byte_pos)
                    cursor_line += n
                if cursor_line == pos:
                    rows, byte_pos2 = await asyncio.to_thread(
                        store.read_lines, path, byte_pos, READ_BATCH, Rollout.from_row
                    )
                    if rows:
                        byte_pos = byte_pos2
                        for row in rows:
                            yield pos, row
                            pos += 1
                            cursor_line += 1
                        continue
                if rec.run is None or (rec.finished and pos >= rec.next_offset):
                    break
                # The file lags the ring (an unflushed batch): wait for the sink to write it.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await changed.wait()
                continue
            if rec.finished or not follow:
                break
            await changed.wait()
        if include_failures and rec.finished:
            async for item in self._failures(rec, pos):
                yield item

    async def _failures(self, rec: JobRecord, pos: int) -> AsyncIterator[tuple[int, Item]]:
        n_rollouts = rec.next_offset
        if rec.has_file:
            if rec.run is None:  # from disk: count the rollouts
                _, n_rollouts = await asyncio.to_thread(
                    store.skip_lines, rec.directory / store.ROLLOUTS, 1 << 62
                )
            failures, _ = await asyncio.to_thread(
                store.read_lines, rec.directory / store.FAILURES, 0, 1 << 62, RolloutFailure.from_row
            )
        else:
            failures = list(rec.run.failures) if rec.run is not None else []
        for i, f in enumerate(failures):
            if n_rollouts + i >= pos:
                yield n_rollouts + i, f
