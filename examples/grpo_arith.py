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
Every `--eval-every` steps a held-out evaluation runs through the same mesh: the `arithmetic`
benchmark (T = 1.0, as `make run` measures it), pass@1 from the job's metrics.

Outputs in `--out`: `metrics.csv` (one row per step: wall time, reward, loss, staleness, update
seconds, held-out pass@1 when evaluated), `metrics.png` (reward and pass@1 against steps and wall
time), `summary.json`, and the last checkpoints. The training split is written there too: every
`What is a + b?` with a, b in 0..99 outside the benchmark's held-out pairs (same rule as the
built-in split).

The training loop uses only `rollmesh_client`; `--embedded` additionally imports the services to
start the mesh in this process (registry, verifier, gateway with `--backend`, scheduler).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import hashlib
import json
import random
import shutil
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollmesh_client import Client
from rollmesh_client.trainer import RolloutBatch, SinkServer, collate
from rollmesh_client.v1 import common_pb2, scheduler_pb2

SHIPPED = Path(__file__).resolve().parents[1] / "services" / "rollmesh" / "builtin" / "models" / "tiny-arith"
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
    """Reward and held-out pass@1 against steps (left) and wall time (right), with PIL."""
    from PIL import Image, ImageDraw

    w, h, pad = 1000, 420, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    series = [("reward", (31, 119, 180)), ("pass_at_1", (214, 39, 40))]
    for panel, xkey in enumerate(("step", "wall_s")):
        x0, x1 = pad + panel * w // 2, (panel + 1) * w // 2 - pad // 2
        d.rectangle((x0, pad, x1, h - pad), outline="black")
        d.text((x0, h - pad + 8), f"{xkey} (y: 0..1)", fill="black")
        xs = [float(r[xkey]) for r in rows] or [0.0]
        lo, hi = min(xs), max(max(xs), min(xs) + 1e-9)
        for name, color in series:
            pts = [
                (x0 + (float(r[xkey]) - lo) / (hi - lo) * (x1 - x0), h - pad - float(r[name]) * (h - 2 * pad))
                for r in rows
                if r.get(name) not in (None, "")
            ]
            if len(pts) > 1:
                d.line(pts, fill=color, width=2)
            for x, y in pts:
                d.ellipse((x - 2, y - 2, x + 2, y + 2), fill=color)
            d.text((x0 + 8, pad + 8 + 14 * series.index((name, color))), name, fill=color)
    img.save(path)


async def evaluate(client: Client, args: argparse.Namespace) -> float:
    """Held-out pass@1 of the policy now serving: the arithmetic benchmark through the mesh."""
    spec = scheduler_pb2.JobSpec(benchmark="arithmetic", limit=args.eval_limit, starting_seed=args.seed)
    job = await client.scheduler.submit(spec)
    await job.result(timeout_s=args.eval_timeout_s)
    metrics = await job.metrics()
    return float(metrics.pass_at_k[1]) if 1 in metrics.pass_at_k else float(metrics.pass_at_1_avg)


@contextlib.asynccontextmanager
async def mesh(args: argparse.Namespace) -> AsyncIterator[tuple[str, str]]:
    """(gateway, scheduler) addresses: the given ones, or an embedded mesh started here."""
    if not args.embedded:
        yield args.gateway, args.scheduler
        return
    from rollmesh.gateway.config import GatewayConfig
    from rollmesh.launch import embedded_mesh

    cfg = GatewayConfig.from_env(
        port=0, http_port=-1, backend=args.backend, model=str(args.model), model_name="tiny-arith", replicas=1
    )
    async with embedded_mesh(cfg, output_dir=str(args.out / "runs")) as m:
        yield m.addresses["gateway"], m.addresses["scheduler"]


async def train(args: argparse.Namespace) -> dict[str, Any]:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, args.torch_threads))
    args.out.mkdir(parents=True, exist_ok=True)
    train_path = args.out / "train.jsonl"
    tasks = write_train_split(train_path, args.seed)
    policy = Policy.load(args.model, args.lr)
    metrics = Metrics()
    started = time.monotonic()
    async with (
        mesh(args) as (gateway, scheduler),
        await Client.connect(gateway=gateway, scheduler=scheduler, timeout_s=60) as client,
    ):
        await client.gateway.set_policy_version("0")
        pass_at_1 = await evaluate(client, args) if args.eval_every else None
        metrics.add(
            {
                "step": 0,
                "wall_s": round(time.monotonic() - started, 1),
                "reward": None,
                "pass_at_1": pass_at_1,
            }
        )
        sink = SinkServer(
            window=args.groups * args.group_size * 2,
            group_complete=True,
            group_size=args.group_size,
            max_staleness=args.max_staleness,
            policy_version=0,
        )
        async with sink:
            spec = scheduler_pb2.JobSpec(
                dataset=str(train_path),
                environment="arithmetic",
                num_repeats=args.group_size,
                limit=min(tasks, args.steps * args.groups * 4),
                starting_seed=args.seed,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=16, logprobs=True),
                sink=scheduler_pb2.SinkSpec(
                    grpc=scheduler_pb2.GrpcSinkSpec(
                        address=sink.address, window=args.groups * args.group_size
                    )
                ),
            )
            job = await client.scheduler.submit(spec)
            emit("train_job_submitted", job_id=job.job_id)
            step = 0
            try:
                async for rollouts in sink.batches(args.groups * args.group_size):
                    batch = collate(rollouts, pad_id=0)
                    versions = [int(v) for v in batch.policy_versions if v.isdigit()]
                    stats = await asyncio.to_thread(policy.step, batch)
                    step += 1
                    ckpt = policy.save(args.out / "checkpoints" / f"step-{step:04d}")
                    t0 = time.monotonic()
                    update = await client.gateway.update_weights(
                        ckpt, policy_version=str(step), in_flight=args.in_flight
                    )
                    sink.policy_version = step
                    update_s = time.monotonic() - t0
                    stale = args.out / "checkpoints" / f"step-{step - 2:04d}"
                    if stale.is_dir():
                        shutil.rmtree(stale)
                    if args.eval_every and step % args.eval_every == 0:
                        pass_at_1 = await evaluate(client, args)
                    else:
                        pass_at_1 = None
                    metrics.add(
                        {
                            "step": step,
                            "wall_s": round(time.monotonic() - started, 1),
                            "reward": round(float(batch.rewards.mean()), 4),
                            "pass_at_1": pass_at_1,
                            "loss": round(stats["loss"], 5),
                            "clip_frac": round(stats["clip_frac"], 4),
                            "tokens": int(stats["tokens"]),
                            "rollout_versions": f"{min(versions)}-{max(versions)}" if versions else "",
                            "max_staleness_seen": (step - 1 - min(versions)) if versions else "",
                            "update_s": round(update_s, 2),
                            "paused_s": round(update.paused_s, 2),
                            "retried": update.retried_requests,
                            "dropped_stale": sink.stats.dropped_stale,
                        }
                    )
                    if step >= args.steps or time.monotonic() - started > args.time_budget_s:
                        break
            finally:
                with contextlib.suppress(Exception):  # the job may have ended already
                    await job.cancel()
        if args.eval_every and step % args.eval_every != 0:
            metrics.rows[-1]["pass_at_1"] = await evaluate(client, args)
    metrics.write(args.out)
    evals = [r["pass_at_1"] for r in metrics.rows if r.get("pass_at_1") is not None]
    summary = {
        "steps": step,
        "wall_s": round(time.monotonic() - started, 1),
        "pass_at_1_first": evals[0] if evals else None,
        "pass_at_1_last": evals[-1] if evals else None,
        "policy_version": step,
        "dropped_stale": sink.stats.dropped_stale,
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
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--time-budget-s", type=float, default=900.0)
    p.add_argument("--groups", type=int, default=8, help="Tasks per step.")
    p.add_argument("--group-size", type=int, default=8, help="Samples per task (GRPO group).")
    p.add_argument("--lr", type=float, default=3e-5)
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--in-flight", choices=["finish", "abort_and_retry"], default="abort_and_retry")
    p.add_argument("--eval-every", type=int, default=10, help="Steps between held-out evals (0: none).")
    p.add_argument("--eval-limit", type=int, default=200, help="Held-out tasks per eval (x8 samples).")
    p.add_argument("--eval-timeout-s", type=float, default=600.0)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(train(parse_args()))))
