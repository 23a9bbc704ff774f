"""A minimal RL consumer of rollmesh: embed the trainer sink, batch rollouts, log GRPO statistics.

    # terminal 1: the mesh (or `rollmesh serve scheduler` etc.)
    # terminal 2:
    python examples/trainer_loop.py --scheduler 127.0.0.1:50054 --benchmark arithmetic \\
        --num-repeats 4 --batch-size 16 --window 32

It starts a `RolloutSink` server (SinkServer) on --port (0 = any free port), submits a job whose
sink is that server, and consumes whole groups (all repeats of a task) in batches: pads them into
numpy arrays, computes GRPO advantages per task group, and logs one line per batch. A real
trainer would run its optimizer step where `train_step` is, then sync weights and bump
`sink.policy_version` (and the gateway's label) so stale rollouts are dropped.

Without --scheduler it only listens (prints its address to stderr as `sink_listening`) and exits
after the first job closes: that is how tests drive it from a scheduler-less harness.
Only the client SDK and numpy are needed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any

import numpy as np

from rollmesh_client.trainer import RolloutBatch
from rollmesh_client.trainer import SinkServer
from rollmesh_client.trainer import collate

log = logging.getLogger("trainer_loop")


def emit(event: str, **fields: Any) -> None:
    """One JSON line per event on stderr (stdout carries only the final summary)."""
    log.info(json.dumps({"event": event, **fields}, default=float))


def train_step(batch: RolloutBatch, adv: np.ndarray[Any, Any]) -> dict[str, float]:
    """Stand-in for an optimizer step: the statistics a GRPO trainer would log."""
    groups = np.unique(batch.group_ids)
    flat = [g for g in groups if np.all(adv[batch.group_ids == g] == 0)]
    tokens = int(batch.loss_mask.sum())
    return {
        "rollouts": len(batch),
        "groups": len(groups),
        "reward_mean": float(batch.rewards.mean()),
        "adv_mean": float(adv.mean()),
        "adv_std": float(adv.std()),
        "adv_abs_max": float(np.abs(adv).max()) if len(adv) else 0.0,
        "zero_adv_groups": len(flat),  # every repeat scored the same: no learning signal
        "trained_tokens": tokens,
        "seq_len": int(batch.input_ids.shape[1]),
        "truncated": int(batch.truncated.sum()),
    }


async def train(
    sink: SinkServer, *, batch_size: int, pad_id: int = 0, max_len: int | None = None
) -> dict[str, Any]:
    """Consume until the job closes; returns a summary."""
    steps: list[dict[str, float]] = []
    seen: set[tuple[str, int, int]] = set()
    async for rollouts in sink.batches(batch_size, until_closed=True):
        batch = collate(rollouts, pad_id=pad_id, max_len=max_len)
        stats = train_step(batch, batch.advantages())
        steps.append(stats)
        seen.update(batch.keys)
        emit("train_step", step=len(steps), **stats)
    return {
        "steps": len(steps),
        "rollouts": len(seen),
        "mean_reward": float(np.mean([s["reward_mean"] for s in steps])) if steps else 0.0,
        "dropped_stale": sink.stats.dropped_stale,
        "failures": sink.stats.failures,
        "max_unacked": sink.stats.max_unacked,
        "batch_sizes": [int(s["rollouts"]) for s in steps],
        "groups_per_batch": [int(s["groups"]) for s in steps],
    }


async def submit(args: argparse.Namespace, sink_address: str) -> str:
    """Submit the job with the raw scheduler stub (the SDK's escape hatch); returns the job id."""
    from rollmesh_client import aio_channel
    from rollmesh_client.v1 import scheduler_pb2
    from rollmesh_client.v1 import scheduler_pb2_grpc

    spec = scheduler_pb2.JobSpec(
        benchmark=args.benchmark or "",
        dataset=args.dataset or "",
        environment=args.environment or "",
        num_repeats=args.num_repeats,
        limit=args.limit,
        sink=scheduler_pb2.SinkSpec(
            grpc=scheduler_pb2.GrpcSinkSpec(address=sink_address, window=args.window)
        ),
    )
    # The sink checks ROLLMESH_API_KEY when it is set (SinkServer's default); the submit carries it too.
    async with aio_channel(args.scheduler, api_key=os.environ.get("ROLLMESH_API_KEY") or None) as channel:
        job = await scheduler_pb2_grpc.RolloutSchedulerStub(channel).SubmitJob(
            scheduler_pb2.SubmitJobRequest(spec=spec), timeout=30
        )
    return str(job.job_id)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    sink = SinkServer(
        host=args.host,
        port=args.port,
        window=args.window,
        group_complete=True,
        max_staleness=args.max_staleness,
        policy_version=args.policy_version,
    )
    async with sink:
        emit("sink_listening", address=sink.address)
        trainer = asyncio.create_task(train(sink, batch_size=args.batch_size, pad_id=args.pad_id))
        if args.scheduler:
            job_id = await submit(args, sink.address)
            emit("job_submitted", job_id=job_id, scheduler=args.scheduler)
        return await trainer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scheduler", default="", help="Scheduler host:port; empty: only listen.")
    p.add_argument("--benchmark", default="arithmetic")
    p.add_argument("--dataset", default="")
    p.add_argument("--environment", default="")
    p.add_argument("--num-repeats", type=int, default=4, help="Group size (repeats per task).")
    p.add_argument("--limit", type=int, default=0, help="First N tasks only (0 = all).")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--window", type=int, default=32, help="Rollouts unacknowledged at most.")
    p.add_argument("--max-staleness", type=int, default=None)
    p.add_argument("--policy-version", type=int, default=0)
    p.add_argument("--pad-id", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    summary = asyncio.run(main(parse_args()))
    sys.stdout.write(json.dumps(summary) + "\n")
