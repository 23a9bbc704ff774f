"""`RollmeshRollouts`: TRL GRPOTrainer's `rollout_func` backed by a rollmesh mesh.

Each call runs the trainer's batch as one rollmesh job on any environment: the batch's prompts
come in groups of `num_generations` copies, each group is one task of the job with
`num_repeats = num_generations` (one GRPO group), and every completion comes back from the job's
token records. Before a batch is generated the trainer's weights are pushed to every replica when
the trainer has taken `sync_every` optimizer steps since the last push, labelled with its global
step, so each record says which policy produced it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh_client._client import Client
from rollmesh_client._gateway import InFlight
from rollmesh_client._rollout import TrainerRollout
from rollmesh_client._scheduler import state_name
from rollmesh_client._sync import _Loop
from rollmesh_client.trl._samples import Messages
from rollmesh_client.trl._samples import RowIndex
from rollmesh_client.trl._samples import TrlSample
from rollmesh_client.trl._samples import failed_sample
from rollmesh_client.trl._samples import prompt_key
from rollmesh_client.trl._samples import trl_sample
from rollmesh_client.trl._weights import WeightPush
from rollmesh_client.trl._weights import WeightPusher
from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import scheduler_pb2

Json = dict[str, Any]


@dataclass
class BatchRecord:
    """What one call did: the job, the policy version it was generated on, what came back."""

    step: int
    mode: str
    job_id: str
    job_state: str
    policy_version: int | None
    completions: int
    failed: int
    failures: dict[str, int]
    versions: dict[int | None, int]
    generate_s: float
    push: WeightPush | None
    groups_replaced: int = 0


@dataclass
class _Outcome:
    """A job's rollouts and failures by key."""

    rollouts: dict[tuple[int, int], TrainerRollout] = field(default_factory=dict)
    failures: dict[tuple[int, int], str] = field(default_factory=dict)


def environment_reward(
    prompts: Sequence[Any], completions: Sequence[Any], env_reward: Sequence[float | None], **_: Any
) -> list[float | None]:
    """The environment's verdict as a TRL reward function (pass it in `reward_funcs`): the reward
    rollmesh's verifier gave each completion; None, which TRL leaves out of its group's statistics,
    for a failed rollout or a verdict the verifier could not give."""
    return list(env_reward)


class RollmeshRollouts:
    """TRL GRPOTrainer's `rollout_func` on a rollmesh mesh (see docs/training.md, "TRL").

        rollouts = RollmeshRollouts(environment="arithmetic", gateway="127.0.0.1:50053",
                                    scheduler="127.0.0.1:50054")
        trainer = GRPOTrainer(model=path, args=GRPOConfig(...), reward_funcs=[environment_reward],
                              train_dataset=rollouts.dataset("train.jsonl"), rollout_func=rollouts)

    `dataset(rows)` registers rollmesh (NeMo Gym) rows, or TRL rows with a `prompt` column, and
    returns the `datasets.Dataset` of their prompts: the trainer hands `rollout_func` the prompts
    only, and each is looked up again to run its row. The job's sampling is the trainer's
    (`temperature`, `top_p`, `top_k`, `max_completion_length` as each turn's max_tokens); settings
    rollmesh cannot apply (`min_p`, `repetition_penalty`, `generation_kwargs`) are refused, not
    ignored.

    Each completion carries extra fields TRL hands the reward functions: `env_reward` (the
    verifier's reward; None for a failed or masked rollout), `rollmesh_failure` (why, "" when none),
    `rollmesh_policy_version`, `rollmesh_finish_reason` and `rollmesh_key` (job/task/repeat: the
    row in the job's rollouts.jsonl under `work_dir/jobs/`).

    Failed rollouts: with `replace_failed_groups` (default) a group with a failed rollout is run
    again with new seeds (the job's `replace_groups="same_task"`), up to `max_replacements`; what
    still fails comes back as a one-id completion with `env_mask` [0] and reward None, which TRL
    counts as unscorable (no loss, advantage 0, not in its group's mean). A batch where nothing
    succeeded raises: there is nothing to train on.

    `work_dir` holds each batch's rows (the scheduler reads the job's dataset from its own
    filesystem: a shared path for a mesh elsewhere) and the checkpoints (`upload_weights=True`
    streams them to a gateway that shares no filesystem)."""

    def __init__(
        self,
        *,
        environment: str,
        gateway: str | None = None,
        scheduler: str | None = None,
        api_key: str | None = None,
        model: str = "",
        work_dir: str | Path | None = None,
        max_steps: int = 0,
        system_prompt: str = "",
        sync_every: int = 1,
        push_initial_weights: bool = True,
        in_flight: InFlight = "finish",
        upload_weights: bool = False,
        replace_failed_groups: bool = True,
        max_replacements: int = 0,
        logprobs: bool = True,
        seed: int = 0,
        concurrency: int = 0,
        job_timeout_s: float = 1800.0,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.environment = environment
        self.model = model
        self.work_dir = (
            Path(work_dir) if work_dir is not None else Path("runs") / f"trl-{uuid.uuid4().hex[:8]}"
        )
        self.max_steps = max_steps
        self.system_prompt = system_prompt
        self.sync_every = sync_every
        self.push_initial_weights = push_initial_weights
        self.replace_failed_groups = replace_failed_groups
        self.max_replacements = max_replacements
        self.logprobs = logprobs
        self.concurrency = concurrency
        self.job_timeout_s = job_timeout_s
        self.weights = WeightPusher(
            self.work_dir.resolve() / "checkpoints",
            model_name=model,
            in_flight=in_flight,
            upload=upload_weights,
        )
        self.history: list[BatchRecord] = []
        self._rows = RowIndex()
        self._next_seed = seed
        self._calls = 0
        self._loop = _Loop()
        self._client = self._loop.run(
            Client.connect(gateway=gateway, scheduler=scheduler, api_key=api_key, timeout_s=120.0)
        )

    # -- datasets -------------------------------------------------------------------------------

    def add_rows(self, rows: Iterable[Mapping[str, Any]]) -> list[Messages]:
        """Register rows (their prompts, in order): every prompt the trainer may hand back must be one."""
        return self._rows.add(rows)

    def dataset(self, source: str | Path | Iterable[Mapping[str, Any]]) -> Any:
        """A `datasets.Dataset` with one `prompt` per row of `source` (a JSONL path or rows),
        registered so that `rollout_func` runs the row itself."""
        from datasets import Dataset

        rows: Iterable[Mapping[str, Any]]
        if isinstance(source, (str, Path)):
            with Path(source).open() as f:
                rows = [json.loads(line) for line in f if line.strip()]
        else:
            rows = source
        return Dataset.from_dict({"prompt": self.add_rows(rows)})

    # -- the rollout_func -----------------------------------------------------------------------

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any] | None]:
        mode = "train" if trainer.model.training else "eval"
        push = self.sync_weights(trainer)
        step = int(trainer.state.global_step)
        tokenizer = trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
        eos_id = int(tokenizer.eos_token_id)
        runs = _runs(prompts)
        rows = [self._rows.row(prompts[start]) for start, _ in runs]
        repeats = max(n for _, n in runs)
        t0 = time.monotonic()
        sampling = _sampling(trainer.args)
        sampling.logprobs = self.logprobs
        job_id, job, outcome = self._loop.run(self._run_job(rows, repeats, sampling))
        samples: list[TrlSample] = []
        replaced = int(job.progress.groups_replaced)
        for task, (_, n) in enumerate(runs):
            chosen = _group(outcome, task, repeats)
            fallback = next((s.prompt_ids for s in chosen if s is not None and s.prompt_ids), None)
            if fallback is None:
                fallback = _template_ids(tokenizer, prompts[runs[task][0]])
            for i in range(n):
                got = chosen[i]
                if got is None or not got.prompt_ids:
                    why = _failure_of(outcome, task, i, repeats) if got is None else got.failure
                    got = failed_sample(fallback, eos_id, why, f"{job_id}/{task}/{i}")
                samples.append(got)
        failures: dict[str, int] = {}
        for s in samples:
            if s.failure:
                cls = s.failure.split(":", 1)[0]
                failures[cls] = failures.get(cls, 0) + 1
        versions: dict[int | None, int] = {}
        for s in samples:
            if not s.failure:
                versions[s.policy_version] = versions.get(s.policy_version, 0) + 1
        record = BatchRecord(
            step=step,
            mode=mode,
            job_id=job_id,
            job_state=state_name(job.state),
            policy_version=self.weights.version,
            completions=len(samples),
            failed=sum(failures.values()),
            failures=failures,
            versions=versions,
            generate_s=time.monotonic() - t0,
            push=push,
            groups_replaced=replaced,
        )
        self.history.append(record)
        if all(s.failure for s in samples):
            raise RuntimeError(
                f"rollmesh job {job_id} ({record.job_state}) gave no usable rollout for this batch of "
                f"{len(samples)}: {failures}{'; ' + job.error if job.error else ''}"
            )
        _log_metrics(trainer, mode, record, samples)
        logprobs = None if any(s.logprobs is None for s in samples) else [s.logprobs for s in samples]
        return {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids for s in samples],
            "logprobs": logprobs,
            "env_mask": [s.env_mask for s in samples],
            "env_reward": [s.reward for s in samples],
            "rollmesh_failure": [s.failure for s in samples],
            "rollmesh_policy_version": [s.policy_version for s in samples],
            "rollmesh_finish_reason": [s.finish_reason for s in samples],
            "rollmesh_key": [s.key for s in samples],
        }

    def sync_weights(self, trainer: Any, *, force: bool = False) -> WeightPush | None:
        """Push the trainer's weights when `sync_every` optimizer steps passed since the last push
        (and once at the start, with `push_initial_weights`): saved, loaded by every replica,
        labelled with the global step. Only the main process pushes; the others wait for it."""
        step = int(trainer.state.global_step)
        last = self.weights.version
        due = force or push_due(last, step, self.sync_every, initial=self.push_initial_weights)
        accelerator = trainer.accelerator
        push = None
        if due and accelerator.is_main_process:
            model = accelerator.unwrap_model(trainer.model)
            if hasattr(model, "peft_config"):  # save_pretrained would write the adapter alone
                raise ValueError(
                    "rollmesh serves full weights: a PEFT model's adapter cannot be pushed as they are "
                    "(train without peft_config, or merge the adapter into the served model yourself)"
                )
            checkpoint, save_s = self.weights.save(model, trainer.processing_class, step)
            push = self._loop.run(self.weights.push(self._client, checkpoint, step, save_s))
        if due:
            accelerator.wait_for_everyone()
        return push

    def close(self) -> None:
        self._loop.run(self._client.close())
        self._loop.close()

    # -- the job --------------------------------------------------------------------------------

    async def _run_job(
        self, rows: list[Json], repeats: int, sampling: common_pb2.SamplingParams
    ) -> tuple[str, scheduler_pb2.Job, _Outcome]:
        self._calls += 1
        batch_dir = self.work_dir.resolve() / "batches"
        batch_dir.mkdir(parents=True, exist_ok=True)
        path = batch_dir / f"batch-{self._calls:06d}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        spec = scheduler_pb2.JobSpec(
            dataset=str(path),
            environment=self.environment,
            model=self.model,
            sampling=sampling,
            num_repeats=repeats,
            starting_seed=self._next_seed,
            concurrency=self.concurrency,
            output_dir=str(self.work_dir.resolve() / "jobs"),
            allowed_failure_fraction=1.0,  # failed rollouts are the trainer's to weigh, not the job's end
        )
        self._next_seed += repeats
        if self.max_steps:
            spec.agent.max_steps = self.max_steps
        if self.system_prompt:
            spec.agent.system_prompt = self.system_prompt
        if self.replace_failed_groups and repeats > 1:
            spec.replace_groups = "same_task"
            spec.max_replacements = self.max_replacements
        job = await self._client.scheduler.submit(spec)
        outcome = _Outcome()
        async with asyncio.timeout(self.job_timeout_s):
            async for item in job.rollouts(follow=True, include_failures=True):
                if item.HasField("rollout"):
                    r = TrainerRollout.from_pb(item.rollout)
                    r.job_id = job.job_id
                    outcome.rollouts[r.key] = r
                else:
                    f = item.failure
                    key = (int(f.key.task_index), int(f.key.rollout_index))
                    outcome.failures[key] = f"{f.error_class}: {f.message}"
            final = await job.result(timeout_s=self.job_timeout_s)
        return job.job_id, final, outcome


def push_due(last: int | None, step: int, sync_every: int, *, initial: bool) -> bool:
    """Whether the trainer at `step` pushes, its last push labelled `last` (None: none yet; the
    mesh serves what it was started with, pushed at once with `initial`)."""
    if last is None:
        return initial or step >= sync_every
    return step - last >= sync_every


def _runs(prompts: Sequence[Any]) -> list[tuple[int, int]]:
    """(start, length) of each run of equal consecutive prompts: TRL's groups (its sampler repeats
    each prompt num_generations times in a row)."""
    runs: list[tuple[int, int]] = []
    keys = [prompt_key(p) for p in prompts]
    for i, k in enumerate(keys):
        if runs and keys[runs[-1][0]] == k:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def _group(outcome: _Outcome, task: int, repeats: int) -> list[TrlSample | None]:
    """The completions of `task`: its first whole generation (a job that replaces failed groups
    writes only whole ones), else generation 0 as far as it came."""
    gens: dict[int, dict[int, TrainerRollout]] = {}
    for (t, r), rollout in outcome.rollouts.items():
        if t == task:
            gens.setdefault(r // repeats, {})[r % repeats] = rollout
    whole = sorted(g for g, got in gens.items() if len(got) == repeats)
    picked = gens.get(whole[0] if whole else 0, {})
    return [trl_sample(picked[i]) if i in picked else None for i in range(repeats)]


def _failure_of(outcome: _Outcome, task: int, index: int, repeats: int) -> str:
    """Why repeat `index` of `task` has no rollout: its last recorded failure."""
    mine = sorted((r, why) for (t, r), why in outcome.failures.items() if t == task and r % repeats == index)
    return mine[-1][1] if mine else "MISSING: the job ended without this rollout"


def _template_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """The prompt's ids by the trainer's chat template: only for a group none of which came back
    (its completions train on nothing; TRL still needs a prompt)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    messages = [{"role": m["role"], "content": m["content"]} for m in prompt]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def _sampling(args: Any) -> common_pb2.SamplingParams:
    """The trainer's sampling settings as the job's; what rollmesh cannot apply is refused."""
    refused = []
    if getattr(args, "min_p", None) not in (None, 0.0):
        refused.append(f"min_p={args.min_p}")
    if getattr(args, "repetition_penalty", 1.0) != 1.0:
        refused.append(f"repetition_penalty={args.repetition_penalty}")
    if getattr(args, "generation_kwargs", None):
        refused.append(f"generation_kwargs={args.generation_kwargs}")
    if refused:
        raise ValueError(f"rollmesh's sampling cannot apply {', '.join(refused)}: unset it in GRPOConfig")
    sampling = common_pb2.SamplingParams(temperature=float(args.temperature), logprobs=True)
    if args.top_p is not None and args.top_p < 1.0:
        sampling.top_p = float(args.top_p)
    if args.top_k:
        sampling.top_k = int(args.top_k)
    if args.max_completion_length:
        sampling.max_tokens = int(args.max_completion_length)
    return sampling


def _log_metrics(trainer: Any, mode: str, record: BatchRecord, samples: Sequence[TrlSample]) -> None:
    """Into TRL's own metric log (averaged and logged with its other metrics at each logging step)."""
    metrics = getattr(trainer, "_metrics", None)
    if not isinstance(metrics, Mapping) or mode not in metrics:
        return
    sink = metrics[mode]
    sink["rollmesh/failed_frac"].append(record.failed / max(record.completions, 1))
    sink["rollmesh/generate_s"].append(record.generate_s)
    if record.policy_version is not None:
        sink["rollmesh/policy_version"].append(float(record.policy_version))
        behind = [record.policy_version - s.policy_version for s in samples if s.policy_version is not None]
        if behind:
            sink["rollmesh/staleness_max"].append(float(max(behind)))
    if record.push is not None:
        sink["rollmesh/weight_update_s"].append(record.push.save_s + record.push.update_s)
