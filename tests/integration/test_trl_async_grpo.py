"""TRL's AsyncGRPOTrainer with rollmesh's rollout worker and weight transfer, contract-tested on CPU
against TRL's own classes (the fake engine playing the multi-turn session_state environment):

- TRL's train-begin callback initialises the transfer, runs its cold weight sync (our UploadWeights,
  labelled 1: the trainer's model_version after it) and starts the worker;
- TRL's own data path (its queue dataset with its staleness bound, batcher and packing collator) takes
  the worker's RolloutSamples: each is a token record (ids, loss mask as completion mask with 0 on the
  tool results, the replica's logprobs, the group's advantage, the record's policy version), and the
  collated batch trains on exactly the masked ids;
- TRL's `_sync_weight` pushes the next version to every replica and tells the worker, and with
  `max_staleness=0` TRL drops what the old version generated: every later sample is the new version's.

What cannot run here: AsyncGRPOTrainer's constructor asks CUDA for the device's peak FLOPs (a metrics
figure: patched to a number below) and its loss forward runs tree attention through the flash-attn3
CUDA kernel (`kernels-community/flash-attn3` from the Hugging Face Hub), so `train()` itself needs a
GPU; everything it does with the worker and the transfer is exercised here.
"""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

import pytest

from rollmesh_client.trl import RollmeshRolloutWorker
from rollmesh_client.trl import RollmeshWeightTransfer
from rollmesh_client.trl import row_prompt
from rollmesh_client.v1 import common_pb2
from tests.meshes import COUNTER_ROWS
from tests.meshes import SHIPPED

pytestmark = pytest.mark.timeout(600)


class RecordingQueue(queue.Queue[Any]):
    """The worker's buffer, remembering what the trainer took from it."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.taken: list[Any] = []

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self.taken.append(item)
        return item


def test_async_grpo_trainer_takes_rollmesh_samples_and_syncs_weights(
    counter_mesh: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trl.experimental.async_grpo.async_grpo_trainer as async_trainer
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    monkeypatch.setattr(async_trainer, "get_peak_flops_per_device", lambda *a, **k: 1.0)  # CUDA-only probe
    rows = [json.loads(line) for line in COUNTER_ROWS.read_text().splitlines()]
    worker = RollmeshRolloutWorker(
        rows,
        environment="session_state",
        num_generations=2,
        gateway=counter_mesh["gateway"],
        scheduler=counter_mesh["scheduler"],
        max_steps=4,
        work_dir=tmp_path / "work",
        sampling=common_pb2.SamplingParams(temperature=1.0, max_tokens=64),
        queue_maxsize=64,
        window=8,
    )
    buffer = worker.rollout_buffer = RecordingQueue(64)
    transfer = RollmeshWeightTransfer(gateway=counter_mesh["gateway"])
    config = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        dtype="float32",
        token_budget=0,  # fixed-count micro-batches (the token budget would ask a vLLM server for its length)
        per_device_train_batch_size=4,
        num_generations=2,
        max_staleness=0,
        max_steps=2,
        report_to=[],
        use_cpu=True,
    )
    trainer = AsyncGRPOTrainer(
        model=str(SHIPPED),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [row_prompt(r) for r in rows]}),
        rollout_worker=worker,
        weight_transfer=transfer,
    )
    try:
        begin = next(
            c for c in trainer.callback_handler.callbacks if type(c).__name__ == "_TrainBeginCallback"
        )
        begin.on_train_begin(None, None, None)
        assert trainer.model_version == transfer.version == worker.model_version == 1
        assert [s["version"] for s in transfer.sends] == [1]
        batches = iter(trainer.get_train_dataloader())

        batch = next(batches)
        first = buffer.taken[:4]  # the first micro-batch (the dataloader may have fetched the next one)
        assert all(s.model_version == 1 for s in first)
        records = {tuple(r.token_ids): r for r in worker.recent}
        for sample in first:
            record = records[tuple(sample.input_ids.tolist())]
            assert sample.completion_mask.tolist() == record.loss_mask  # 0 on the prompt and tool results
            assert len(record.raw.tokens.turns) == 3 and 0 in record.loss_mask[record.prompt_length :]
            assert record.logprobs is not None
            assert sample.old_log_probs.tolist() == pytest.approx(record.logprobs)
            assert sample.metrics["reward"] == record.reward == 1.0
            assert sample.advantage == 0.0  # every repeat of the counter task succeeds: no signal
            assert sample.model_version == record.version == 1
        # TRL's collator trains on exactly the masked ids of the samples it packed
        assert float(batch["global_n_tokens"][0]) == sum(int(s.completion_mask.sum()) for s in first)

        trainer._sync_weight()
        assert trainer.model_version == transfer.version == worker.model_version == 2
        for _ in range(3):
            next(batches)
        # TRL's staleness bound read our versions: what version 1 generated and TRL took after the sync
        # was dropped (staleness 1 > max_staleness 0), everything it yielded had staleness 0, and the
        # worker went on with version 2's rollouts
        metrics = trainer._metrics["train"]
        dropped, yielded = len(metrics["sample/dropped_stale_total"]), len(metrics["sample/staleness_max"])
        versions = [s.model_version for s in buffer.taken]
        assert dropped > 0 and yielded + dropped == len(versions), (versions, dropped, yielded)
        assert set(metrics["sample/staleness_max"]) == {0.0}
        assert versions.count(2) >= 4 and versions == sorted(versions)
        generated = {
            (tuple(r.token_ids), r.version) for r in worker.recent
        }  # (the fake engine repeats itself)
        assert all((tuple(s.input_ids.tolist()), s.model_version) in generated for s in buffer.taken)
        worker.check_health(stale_after_s=300)
    finally:
        worker.stop()
        transfer.destroy()
    assert worker.jobs and worker.groups >= 4


def test_a_worker_that_cannot_run_its_job_is_unhealthy(counter_mesh: dict[str, str], tmp_path: Path) -> None:
    worker = RollmeshRolloutWorker(
        [{"responses_create_params": {"input": "hi"}, "expected_answer": "1"}],
        environment="no_such_environment",
        num_generations=2,
        gateway=counter_mesh["gateway"],
        scheduler=counter_mesh["scheduler"],
        work_dir=tmp_path / "work",
    )
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="no_such_environment"):
            for _ in range(600):
                worker.check_health(stale_after_s=600)
                worker._stop.wait(0.1)
    finally:
        worker.stop()
