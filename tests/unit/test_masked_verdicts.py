"""A verdict the environment masks (NeMo Gym's `mask_sample`: it could not judge the response) is
recorded with the rollout, left out of every reward metric and given no loss by the trainer SDK:
never counted as a 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rollmesh.mesh.fields import from_pb
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler import store
from rollmesh.scheduler.convert import metrics_to_pb
from rollmesh.scheduler.convert import rollout_to_pb
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.engine import Progress
from rollmesh.scheduler.manager import JobRecord
from rollmesh.scheduler.metrics import compute
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.records import Json
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.sinks.jsonl import JsonlSink
from rollmesh.scheduler.spec import JobSpec
from rollmesh.verifier.convert import result_to_pb
from rollmesh_client.trainer import TrainerRollout
from rollmesh_client.trainer import collate
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows


class MaskingEnv(LocalEnv):
    """Masks every verdict of task 1 (its judge "failed"), with the reward a failed judge leaves: 0."""

    async def verify(self, environment: str, task: Json, messages: list[Json], session_id: str) -> Any:
        verdict = await super().verify(environment, task, messages, session_id)
        if task["responses_create_params"]["input"][0]["content"] == self.masked_prompt:
            return VerifyResult(0.0, details={"failure_kind": "judge_failed"}, masked=True)
        return verdict

    masked_prompt = ""


async def _no_sleep(_: float) -> None:
    return None


async def test_a_masked_verdict_is_recorded_and_left_out_of_every_reward_metric(tmp_path: Path) -> None:
    rows = Rows.arithmetic(3)
    env = MaskingEnv()
    env.masked_prompt = rows.rows[1]["responses_create_params"]["input"][0]["content"]
    spec = JobSpec(dataset=str(rows.write(tmp_path / "d.jsonl")), environment="arithmetic", num_repeats=2)
    sink = MemorySink()
    plan = build_plan(Catalog([Root(BUILTIN_ROOT, 0, "root")]), spec)
    run = JobRun("job-m", plan, sink, model=LocalModel(), env=env, hooks=Hooks(sleep=_no_sleep))
    assert (await run.run(await run.open())).state == "SUCCEEDED"

    masked = sorted(r.key for r in sink.rollouts if r.masked)
    assert masked == [RolloutKey(1, 0), RolloutKey(1, 1)]
    assert all(r.reward == 1.0 for r in sink.rollouts if not r.masked)  # the model solves arithmetic

    # the row says so in NeMo Gym's word, and reads back
    row = next(r for r in sink.rollouts if r.masked).to_row()
    assert row["mask_sample"] is True and row["verify_details"] == {"failure_kind": "judge_failed"}
    assert Rollout.from_row(row).masked and not Rollout.from_row({**row, "mask_sample": False}).masked

    m = compute(sink.rollouts)
    assert (m.num_rollouts, m.num_tasks, m.num_masked) == (6, 3, 2)
    # measured: tasks 0 and 2, all correct; counted as 0s, the mean would be 4/6 and pass@1 2/3
    assert (m.mean_reward, m.pass_at_1_avg, m.pass_at_k[2]) == (1.0, 1.0, 1.0)
    assert [t.task_index for t in m.tasks] == [0, 2]
    assert metrics_to_pb(m).num_masked == 2 and metrics_to_pb(m.to_json()).num_masked == 2
    # the live figures (the progress bar, GetJob) agree: counted as 0s the running mean was 4/6
    assert (run.progress.mean_reward, run.progress.masked, run.progress.succeeded) == (1.0, 2, 6)


async def test_the_progress_of_a_jsonl_job_leaves_masked_verdicts_out_on_disk_and_read_back(
    tmp_path: Path,
) -> None:
    rows = Rows.arithmetic(3)
    env = MaskingEnv()
    env.masked_prompt = rows.rows[1]["responses_create_params"]["input"][0]["content"]
    spec = JobSpec(dataset=str(rows.write(tmp_path / "d.jsonl")), environment="arithmetic", num_repeats=2)
    sink = JsonlSink(tmp_path / "job", flush_interval_s=0)
    plan = build_plan(Catalog([Root(BUILTIN_ROOT, 0, "root")]), spec)
    run = JobRun("job-m", plan, sink, model=LocalModel(), env=env, hooks=Hooks(sleep=_no_sleep))
    assert (await run.run(await run.open())).state == "SUCCEEDED"
    await sink.close(state="SUCCEEDED", metrics=None)

    assert (sink.rows_written, sink.masked_written, sink.reward_written) == (6, 2, 4.0)
    on_disk = store.count_on_disk(tmp_path / "job")
    assert (on_disk.rollouts, on_disk.masked, on_disk.reward_sum) == (6, 2, 4.0)
    # a job read back from its folder, and one read back from job.json's progress alone
    from_disk = JobRecord("job-m", "", spec, tmp_path / "job", 0.0, state="SUCCEEDED", on_disk=on_disk)
    stored = {"succeeded": 6, "masked": 2, "mean_reward": 1.0}
    from_json = JobRecord("job-m", "", spec, tmp_path / "job", 0.0, state="SUCCEEDED", stored_progress=stored)
    assert from_disk.progress.mean_reward == from_json.progress.mean_reward == 1.0
    assert JobRecord("j", "", spec, tmp_path, 0.0).to_json()["progress"]["masked"] == 0


def test_a_masked_rollout_the_trainer_never_consumed_leaves_the_progress_as_it_was() -> None:
    p = Progress(succeeded=3)
    for reward in (1.0, 0.0, None):  # None: metrics.measured_reward of a masked rollout
        p.add_reward(reward)
    assert (p.mean_reward, p.masked) == (0.5, 1)
    p.succeeded -= 1
    p.add_reward(None, -1)  # what JobRun does when the gRPC sink reports it unconsumed
    assert (p.mean_reward, p.masked) == (0.5, 0)


def test_every_rollout_masked_gives_no_reward_figure_and_counts_its_tokens() -> None:
    r = Rollout(RolloutKey(0, 0), "j", {}, [], 0.0, completion_tokens=7, masked=True)
    m = compute([r])
    assert (m.num_rollouts, m.num_masked, m.pass_at_k, m.tasks, m.total_completion_tokens) == (
        1,
        1,
        {},
        [],
        7,
    )


def test_the_masked_flag_crosses_verifier_and_sink_wires() -> None:
    wire = result_to_pb(VerifyResult(0.0, masked=True))
    assert (
        from_pb(VerifyResult, wire).masked
        and not from_pb(VerifyResult, result_to_pb(VerifyResult(1.0))).masked
    )
    rollout = Rollout(RolloutKey(0, 1), "j", {}, [], 0.0, masked=True)
    assert TrainerRollout.from_pb(rollout_to_pb(rollout)).masked


def test_collate_gives_a_masked_rollout_no_loss_and_no_weight_in_its_group() -> None:
    def trainer_rollout(index: int, reward: float, masked: bool) -> TrainerRollout:
        r = Rollout(RolloutKey(0, index), "j", {}, [], reward, masked=masked)
        r.tokens.token_ids, r.tokens.loss_mask, r.tokens.logprobs = [1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5]
        return TrainerRollout.from_pb(rollout_to_pb(r))

    batch = collate(
        [trainer_rollout(0, 1.0, False), trainer_rollout(1, 0.0, False), trainer_rollout(2, 0.0, True)]
    )
    assert batch.masked is not None and batch.masked.tolist() == [False, False, True]
    assert batch.loss_mask.tolist() == [[0, 1, 1], [0, 1, 1], [0, 0, 0]]
    adv = batch.advantages()
    # the group's mean is (1 + 0) / 2 from the measured two: the masked 0 does not pull it down
    assert adv[2] == 0.0 and np.isclose(adv[0], -adv[1]) and np.isclose(adv[0], 1.0, atol=1e-4)
