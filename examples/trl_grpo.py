"""TRL's GRPOTrainer with rollmesh as its rollout engine (docs/training.md, "TRL").

    python examples/trl_grpo.py --embedded                       # the tiny model on arithmetic
    python examples/trl_grpo.py --gateway HOST:PORT --scheduler HOST:PORT --model MODEL_DIR \\
        --environment my_env --dataset rows.jsonl --max-turns 8    # any environment of a running mesh
    python examples/trl_grpo.py --embedded --generation both     # TRL's own generation side by side

`--generation rollmesh` (default): `RollmeshRollouts` is the trainer's `rollout_func`: every batch is
a rollmesh job on `--environment` (built-in, NeMo Gym-bridged, verifiers, reasoning-gym; multi-turn
tool use included), TRL trains on the token records (its env_mask = their loss mask) and the reward
is the environment's (`environment_reward`); the trainer's weights reach every replica before each
batch (UpdateWeights, labelled with the step). `--generation trl`: the same trainer generating with
its own model (transformers on CPU, single turn) and the same verifier scoring each completion (a
reward function calling the mesh's verifier), for comparison. `both` runs the two one after the
other in this process, on one mesh, from the same initial weights, each with `--time-budget-s` of
training.

The data: `--dataset` rows (rollmesh / NeMo Gym JSONL), or by default the arithmetic training split
of examples/grpo_arith.py (every `What is a + b?` outside the benchmark's held-out pairs). Held-out
pass@1 (every `--eval-every` steps and at the end): the `arithmetic` benchmark (`--eval-limit` tasks
x 8 samples at T = 1.0) by default, or `--eval-dataset` rows on `--environment`, through the mesh
with the trainer's current weights pushed first. Outputs in `--out/<generation>/`: `metrics.csv`
(per step: wall time, reward, loss, policy version, seconds generating, pass@1 when evaluated) and
`summary.json`; with `both`, `--out/comparison.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import random
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL marks rollout_func experimental

import torch
from grpo_arith import SHIPPED
from grpo_arith import write_train_split

from rollmesh_client import Client
from rollmesh_client._sync import _Loop
from rollmesh_client.trl import RollmeshRollouts
from rollmesh_client.trl import WeightPusher
from rollmesh_client.trl import environment_reward
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2


def emit(event: str, **fields: Any) -> None:
    sys.stderr.write(json.dumps({"event": event, **fields}, default=float) + "\n")
    sys.stderr.flush()


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.asynccontextmanager
async def mesh(args: argparse.Namespace) -> AsyncIterator[dict[str, str]]:
    """The mesh's addresses: the given ones, or those of an embedded mesh started here."""
    if not args.embedded:
        yield {"gateway": args.gateway, "scheduler": args.scheduler, "verifier": args.verifier}
        return
    from rollmesh.gateway.config import GatewayConfig
    from rollmesh.launch import embedded_mesh
    from rollmesh.mesh.config import ServerFlags

    cfg = GatewayConfig.from_env(
        ServerFlags(port=0),
        http_port=-1,
        backend=args.backend,
        model=str(args.model),
        model_name=args.model.name,
        replicas=1,
    )
    async with embedded_mesh(cfg, output_dir=str(args.out / "runs")) as m:
        yield dict(m.addresses)


@dataclass
class Mesh:
    """The SDK on a private loop (the trainer's loop is synchronous): evaluation and weight pushes."""

    addresses: dict[str, str]
    loop: _Loop = field(default_factory=_Loop)
    client: Client | None = None

    def __post_init__(self) -> None:
        a = self.addresses
        self.client = self.loop.run(
            Client.connect(gateway=a["gateway"], scheduler=a["scheduler"], verifier=a["verifier"])
        )

    @property
    def gateway(self) -> str:
        return self.addresses["gateway"]

    @property
    def scheduler(self) -> str:
        return self.addresses["scheduler"]

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def close(self) -> None:
        assert self.client is not None
        self.loop.run(self.client.close())
        self.loop.close()


async def held_out_pass_at_1(client: Client, args: argparse.Namespace) -> float:
    """pass@1 of the policy now serving on the held-out rows (8 samples each, T = 1.0)."""
    if args.eval_dataset:
        spec = scheduler_pb2.JobSpec(
            dataset=str(args.eval_dataset.resolve()),
            environment=args.environment,
            num_repeats=8,
            starting_seed=args.seed,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=args.max_completion_length),
        )
        if args.max_turns:
            spec.agent.max_steps = args.max_turns
    else:
        spec = scheduler_pb2.JobSpec(benchmark="arithmetic", limit=args.eval_limit, starting_seed=args.seed)
    job = await client.scheduler.submit(spec)
    await job.result(timeout_s=args.eval_timeout_s)
    metrics = await job.metrics()
    return float(metrics.pass_at_k[1]) if 1 in metrics.pass_at_k else float(metrics.pass_at_1_avg)


def verifier_reward(m: Mesh, environment: str) -> Any:
    """TRL's own generation scored by the mesh's verifier (the same verdicts as the rollmesh arm)."""

    async def verify_all(rows: list[dict[str, Any]], texts: list[str]) -> list[float | None]:
        assert m.client is not None
        results = await asyncio.gather(
            *(
                m.client.verifier.verify(environment, row, text)
                for row, text in zip(rows, texts, strict=True)
            ),
            return_exceptions=True,
        )
        for r in results:
            if isinstance(r, BaseException):
                emit("verify_failed", error=str(r)[:200])
        return [None if isinstance(r, BaseException) or r.masked else float(r.reward) for r in results]

    def environment_verdict(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        rows = [{"expected_answer": a} for a in columns["expected_answer"]]
        return list(m.run(verify_all(rows, texts)))

    return environment_verdict


def trainer_for(
    args: argparse.Namespace, generation: str, rows: list[dict[str, Any]], m: Mesh, out: Path
) -> tuple[Any, RollmeshRollouts | None]:
    from datasets import Dataset
    from trl import GRPOConfig
    from trl import GRPOTrainer

    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=args.groups * args.group_size,
        num_generations=args.group_size,
        max_steps=args.steps,
        max_completion_length=args.max_completion_length,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        temperature=1.0,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    if generation == "rollmesh":
        rollouts = RollmeshRollouts(
            environment=args.environment,
            gateway=m.gateway,
            scheduler=m.scheduler,
            work_dir=out / "rollmesh",
            max_steps=args.max_turns,
            seed=args.seed,
        )
        trainer = GRPOTrainer(
            model=str(args.model),
            reward_funcs=[environment_reward],
            args=config,
            train_dataset=rollouts.dataset(rows),
            rollout_func=rollouts,
        )
        return trainer, rollouts
    prompts = [r["responses_create_params"]["input"] for r in rows]
    dataset = Dataset.from_dict(
        {"prompt": prompts, "expected_answer": [str(r["expected_answer"]) for r in rows]}
    )
    trainer = GRPOTrainer(
        model=str(args.model),
        reward_funcs=[verifier_reward(m, args.environment)],
        args=config,
        train_dataset=dataset,
    )
    return trainer, None


def train_one(
    args: argparse.Namespace, generation: str, rows: list[dict[str, Any]], m: Mesh
) -> dict[str, Any]:
    """One arm: train until --steps or --time-budget-s of training (evaluations left out), evaluating
    every --eval-every steps; returns its summary."""
    from transformers import TrainerCallback

    out = args.out / generation
    out.mkdir(parents=True, exist_ok=True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    trainer, rollouts = trainer_for(args, generation, rows, m, out)
    pusher = WeightPusher(out / "eval-checkpoints") if rollouts is None else None
    evals: list[dict[str, Any]] = []
    started = time.monotonic()
    eval_s = 0.0

    def evaluate(step: int) -> None:
        nonlocal eval_s
        t0 = time.monotonic()
        if rollouts is not None:
            rollouts.sync_weights(trainer, force=True)
        else:
            assert pusher is not None and m.client is not None
            ckpt, save_s = pusher.save(
                trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class, step
            )
            m.run(pusher.push(m.client, ckpt, step, save_s))
        assert m.client is not None
        pass_at_1 = float(m.run(held_out_pass_at_1(m.client, args)))
        eval_s += time.monotonic() - t0
        evals.append(
            {"step": step, "pass_at_1": pass_at_1, "train_s": round(time.monotonic() - started - eval_s, 1)}
        )
        emit("held_out", generation=generation, step=step, pass_at_1=pass_at_1)

    class Schedule(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            over = time.monotonic() - started - eval_s >= args.time_budget_s
            if over:
                control.should_training_stop = True
            elif args.eval_every and state.global_step % args.eval_every == 0:
                evaluate(int(state.global_step))

    evaluate(0)
    trainer.add_callback(Schedule())
    trainer.train()
    steps = int(trainer.state.global_step)
    if evals[-1]["step"] != steps:
        evaluate(steps)
    train_s = time.monotonic() - started - eval_s
    logs = [e for e in trainer.state.log_history if "reward" in e]
    with (out / "metrics.csv").open("w", newline="") as f:
        keys = ["step", "reward", "loss", "rollmesh/policy_version", "rollmesh/generate_s", "step_time"]
        w = csv.DictWriter(f, fieldnames=[*keys, "pass_at_1"], extrasaction="ignore")
        w.writeheader()
        by_step = {e["step"]: e["pass_at_1"] for e in evals}
        w.writerows({**e, "pass_at_1": by_step.get(e["step"], "")} for e in logs)
    summary = {
        "generation": generation,
        "steps": steps,
        "train_s": round(train_s, 1),
        "steps_per_min": round(steps * 60 / train_s, 2) if train_s > 0 else None,
        "held_out": evals,
        "pass_at_1_first": evals[0]["pass_at_1"],
        "pass_at_1_last": evals[-1]["pass_at_1"],
        "reward_first_10": _mean([e["reward"] for e in logs[:10]]),
        "reward_last_10": _mean([e["reward"] for e in logs[-10:]]),
        "policy_versions": sorted({p.version for p in rollouts.weights.pushes}) if rollouts else None,
        "failed_completions": sum(h.failed for h in rollouts.history) if rollouts else None,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    if rollouts is not None:
        rollouts.close()
    return summary


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return round(sum(values) / len(values), 4) if values else None


def main(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(max(1, args.torch_threads))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dataset:
        rows = read_rows(args.dataset)
    else:
        path = args.out / "train.jsonl"
        write_train_split(path, args.seed)
        rows = read_rows(path)
    arms = ["rollmesh", "trl"] if args.generation == "both" else [args.generation]
    results: dict[str, Any] = {}

    async def serve(ready: asyncio.Future[dict[str, str]], done: asyncio.Event) -> None:
        async with mesh(args) as addresses:
            ready.set_result(addresses)
            await done.wait()

    # The mesh's servers run on a loop of their own (embedded, or nothing to serve for a remote one):
    # the trainer blocks its thread for whole steps.
    server_loop = _Loop()
    ready: asyncio.Future[dict[str, str]] = server_loop.loop.create_future()
    done = asyncio.Event()
    serving = asyncio.run_coroutine_threadsafe(serve(ready, done), server_loop.loop)
    m = Mesh(asyncio.run_coroutine_threadsafe(_wait(ready), server_loop.loop).result())
    try:
        for arm in arms:
            results[arm] = train_one(args, arm, rows, m)
            emit("arm_done", **results[arm])
    finally:
        m.close()
        server_loop.loop.call_soon_threadsafe(done.set)
        serving.result(timeout=300)
        server_loop.close()
    if len(arms) > 1:
        (args.out / "comparison.json").write_text(json.dumps(results, indent=2))
    return results


async def _wait(ready: asyncio.Future[dict[str, str]]) -> dict[str, str]:
    return await ready


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gateway", default="127.0.0.1:50053")
    p.add_argument("--scheduler", default="127.0.0.1:50054")
    p.add_argument(
        "--verifier", default="127.0.0.1:50052", help="--generation trl: scores TRL's completions."
    )
    p.add_argument("--embedded", action="store_true", help="Start the mesh in this process.")
    p.add_argument("--backend", default="ray-serve", help="--embedded: ray-serve (vLLM) or fake.")
    p.add_argument(
        "--model", type=Path, default=SHIPPED, help="The model to train (the one the mesh serves)."
    )
    p.add_argument("--environment", default="arithmetic")
    p.add_argument(
        "--dataset", type=Path, default=None, help="Training rows (default: the arithmetic split)."
    )
    p.add_argument(
        "--eval-dataset", type=Path, default=None, help="Held-out rows (default: the arithmetic benchmark)."
    )
    p.add_argument("--max-turns", type=int, default=0, help="Model turns per rollout (0: the environment's).")
    p.add_argument("--generation", choices=["rollmesh", "trl", "both"], default="rollmesh")
    p.add_argument("--out", type=Path, default=Path("runs/trl_grpo"))
    p.add_argument("--steps", type=int, default=80)
    p.add_argument(
        "--time-budget-s", type=float, default=600.0, help="Training seconds per arm (evals excluded)."
    )
    p.add_argument("--groups", type=int, default=16, help="Tasks per step.")
    p.add_argument("--group-size", type=int, default=8, help="num_generations: samples per task.")
    p.add_argument("--max-completion-length", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--eval-every", type=int, default=20, help="Steps between held-out evaluations (0: start and end)."
    )
    p.add_argument("--eval-limit", type=int, default=200)
    p.add_argument("--eval-timeout-s", type=float, default=600.0)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(main(parse_args())))
