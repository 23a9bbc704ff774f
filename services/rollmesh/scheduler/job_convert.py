"""Proto <-> domain for jobs: JobSpec, Job, JobProgress (records live in convert.py)."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from rollmesh.scheduler.manager import JobRecord
from rollmesh.scheduler.spec import SAMPLING_FIELDS, JobSpec, RetryPolicy, SinkConfig
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2 as pb

STATES = {
    "PENDING": pb.JOB_STATE_PENDING,
    "RUNNING": pb.JOB_STATE_RUNNING,
    "SUCCEEDED": pb.JOB_STATE_SUCCEEDED,
    "FAILED": pb.JOB_STATE_FAILED,
    "CANCELLED": pb.JOB_STATE_CANCELLED,
    "COMPLETED_WITH_FAILURES": pb.JOB_STATE_COMPLETED_WITH_FAILURES,
    "INTERRUPTED": pb.JOB_STATE_INTERRUPTED,
}


def sampling_from_pb(msg: common_pb2.SamplingParams) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in SAMPLING_FIELDS:
        if name == "stop":
            if msg.stop:
                out["stop"] = list(msg.stop)
        elif msg.HasField(name):  # type: ignore[arg-type]
            out[name] = getattr(msg, name)
    return out


def sampling_to_pb(s: dict[str, object]) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams()
    for name, value in s.items():
        if name == "stop":
            msg.stop.extend([str(x) for x in value] if isinstance(value, list) else [str(value)])
        elif name in SAMPLING_FIELDS:
            setattr(msg, name, value)
    return msg


def spec_from_pb(msg: pb.JobSpec) -> JobSpec:
    kind = msg.sink.WhichOneof("kind") or "jsonl"
    sink = SinkConfig(
        kind=kind,
        fsync_every=msg.sink.jsonl.fsync_every if kind == "jsonl" else 0,
        address=msg.sink.grpc.address if kind == "grpc" else "",
        window=msg.sink.grpc.window if kind == "grpc" else 0,
    )
    r = msg.retry
    return JobSpec(
        benchmark=msg.benchmark,
        dataset=msg.dataset,
        environment=msg.environment,
        max_steps=msg.agent.max_steps,
        system_prompt=msg.agent.system_prompt,
        model=msg.model,
        sampling=sampling_from_pb(msg.sampling),
        num_repeats=msg.num_repeats,
        starting_seed=msg.starting_seed,
        limit=msg.limit,
        shard_index=msg.shard.index,
        shard_count=msg.shard.count,
        concurrency=msg.concurrency,
        sink=sink,
        retry=RetryPolicy(
            max_attempts=r.max_attempts,
            initial_backoff_s=r.initial_backoff_s,
            max_backoff_s=r.max_backoff_s,
            rollout_timeout_s=r.rollout_timeout_s,
            max_consecutive_unavailable=r.max_consecutive_unavailable,
            unavailable_budget_s=r.unavailable_budget_s,
            fail_fast_after=r.fail_fast_after,
            attempt_deadline_multiplier=r.attempt_deadline_multiplier,
            attempt_deadline_floor_s=r.attempt_deadline_floor_s,
            fixed_attempt_deadline=r.fixed_attempt_deadline,
        ),
        output_dir=msg.output_dir,
        resume_job_id=msg.resume_job_id,
        validate_all=msg.validate_all,
        k_values=tuple(msg.k_values),
        allowed_failures=msg.allowed_failures,
        allowed_failure_fraction=msg.allowed_failure_fraction,
        resume_latest=msg.resume_latest,
    )


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    msg = pb.JobSpec(
        benchmark=spec.benchmark,
        dataset=spec.dataset,
        environment=spec.environment,
        agent=pb.AgentSpec(max_steps=spec.max_steps, system_prompt=spec.system_prompt),
        model=spec.model,
        sampling=sampling_to_pb(spec.sampling),
        num_repeats=spec.num_repeats,
        starting_seed=spec.starting_seed,
        limit=spec.limit,
        shard=pb.Shard(index=spec.shard_index, count=spec.shard_count),
        concurrency=spec.concurrency,
        retry=pb.RetryPolicy(
            max_attempts=spec.retry.max_attempts,
            initial_backoff_s=spec.retry.initial_backoff_s,
            max_backoff_s=spec.retry.max_backoff_s,
            rollout_timeout_s=spec.retry.rollout_timeout_s,
            max_consecutive_unavailable=spec.retry.max_consecutive_unavailable,
            unavailable_budget_s=spec.retry.unavailable_budget_s,
            fail_fast_after=spec.retry.fail_fast_after,
            attempt_deadline_multiplier=spec.retry.attempt_deadline_multiplier,
            attempt_deadline_floor_s=spec.retry.attempt_deadline_floor_s,
            fixed_attempt_deadline=spec.retry.fixed_attempt_deadline,
        ),
        output_dir=spec.output_dir,
        resume_job_id=spec.resume_job_id,
        validate_all=spec.validate_all,
        k_values=list(spec.k_values),
        allowed_failures=spec.allowed_failures,
        allowed_failure_fraction=spec.allowed_failure_fraction,
        resume_latest=spec.resume_latest,
    )
    if spec.sink.kind == "grpc":
        msg.sink.grpc.CopyFrom(pb.GrpcSinkSpec(address=spec.sink.address, window=spec.sink.window))
    else:
        msg.sink.jsonl.CopyFrom(pb.JsonlSinkSpec(fsync_every=spec.sink.fsync_every))
    return msg


def _ts(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def job_to_pb(rec: JobRecord, now: float) -> pb.Job:
    p = rec.progress
    rps, tps = p.rates(now)
    job = pb.Job(
        job_id=rec.job_id,
        spec=spec_to_pb(rec.spec),
        state=STATES.get(rec.state, pb.JOB_STATE_UNSPECIFIED),
        progress=pb.JobProgress(
            total=p.total,
            done=p.done,
            succeeded=p.succeeded,
            failed=p.failed,
            in_flight=p.in_flight,
            skipped_existing=p.skipped_existing,
            mean_reward=p.mean_reward,
            rollouts_per_second=rps,
            tokens_per_second=tps,
            retries=p.retries,
            waiting_on=p.waiting_on,
            model_calls_cut=p.model_calls_cut,
        ),
        create_time=_ts(rec.create_time),
        error=rec.error,
        output_path=str(rec.directory) if rec.has_file else "",
        request_id=rec.request_id,
        resumable=rec.resumable,
        failure_summary=[
            pb.FailureClassSummary(
                error_class=s.error_class, count=s.count, example_message=s.example_message
            )
            for s in rec.failure_summary
        ],
    )
    if rec.end_time is not None:
        job.end_time.CopyFrom(_ts(rec.end_time))
    return job
