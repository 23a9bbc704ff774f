"""Proto <-> domain for jobs: JobSpec, Job, JobProgress (records live in convert.py)."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf import timestamp_pb2

from rollmesh.mesh.fields import from_pb
from rollmesh.mesh.fields import to_pb
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler.convert import sampling_from_pb
from rollmesh.scheduler.convert import sampling_to_pb
from rollmesh.scheduler.convert import state_to_pb
from rollmesh.scheduler.manager import JobRecord
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.scheduler.spec import SinkConfig
from rollmesh_client.v1 import scheduler_pb2 as pb

log = get_logger("rollmesh.scheduler")


def spec_from_pb(msg: pb.JobSpec) -> JobSpec:
    # One of the two is set (the oneof `kind`); the other reads as all defaults.
    kind = msg.sink.WhichOneof("kind") or "jsonl"
    sink = from_pb(SinkConfig, msg.sink.grpc, kind=kind, fsync_every=msg.sink.jsonl.fsync_every)
    return from_pb(
        JobSpec,
        msg,
        max_steps=msg.agent.max_steps,
        system_prompt=msg.agent.system_prompt,
        agent_program=tuple(msg.agent.program),
        agent_program_env=dict(msg.agent.program_env),
        oracle=msg.agent.oracle,
        agent_program_mode=msg.agent.program_mode,
        sampling=sampling_from_pb(msg.sampling),
        shard_index=msg.shard.index,
        shard_count=msg.shard.count,
        sink=sink,
        retry=from_pb(RetryPolicy, msg.retry),
    )


def spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    s = spec.sink
    return to_pb(
        pb.JobSpec,
        spec,
        agent=pb.AgentSpec(
            max_steps=spec.max_steps,
            system_prompt=spec.system_prompt,
            program=spec.agent_program,
            program_env=spec.agent_program_env,
            oracle=spec.oracle,
            program_mode=spec.agent_program_mode,
        ),
        sampling=sampling_to_pb(spec.sampling),
        shard=pb.Shard(index=spec.shard_index, count=spec.shard_count),
        sink=pb.SinkSpec(
            grpc=pb.GrpcSinkSpec(address=s.address, window=s.window, ack_timeout_s=s.ack_timeout_s)
        )
        if s.kind == "grpc"
        else pb.SinkSpec(jsonl=pb.JsonlSinkSpec(fsync_every=s.fsync_every)),
    )


def _ts(t: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def job_to_pb(rec: JobRecord, now: float) -> pb.Job:
    p = rec.progress
    rps, tps = p.rates(now)
    return to_pb(
        pb.Job,
        rec,
        spec=spec_to_pb(rec.spec),
        state=state_to_pb(rec.state),
        progress=to_pb(pb.JobProgress, p, rollouts_per_second=rps, tokens_per_second=tps),
        create_time=_ts(rec.create_time),
        end_time=None if rec.end_time is None else _ts(rec.end_time),
        output_path=str(rec.directory) if rec.has_file else "",
    )


def jobs_to_pb(records: Sequence[JobRecord], now: float) -> list[pb.Job]:
    """Each record as a Job; one read from a job.json that no longer converts (a count edited past
    the proto's range) is logged and left out, so one bad file never fails the listing of all."""
    jobs = []
    for rec in records:
        try:
            jobs.append(job_to_pb(rec, now))
        except (TypeError, ValueError, OverflowError) as exc:
            log.warning("job_file_corrupt", job_id=rec.job_id, error=str(exc))
    return jobs
