"""Group scoring in the engine (an environment whose `scores_groups`), over in-process fake ports: a
task's rollouts are held, their verifier sessions open, until the last is done; one `verify_group`
scores them; their rows are written together, after it, and never without it. A failed rollout
fails its group; a resumed job runs whole groups only; a stopped run writes nothing of a held group."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.drivers.agent_loop import GroupMember
from rollmesh.scheduler.engine import Hooks
from rollmesh.scheduler.engine import JobRun
from rollmesh.scheduler.engine import RunResult
from rollmesh.scheduler.errors import BadReward
from rollmesh.scheduler.errors import MalformedDatasetRow
from rollmesh.scheduler.plan import build_plan
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


async def _no_sleep(_: float) -> None:
    return None


class GroupEnv(LocalEnv):
    """Scores groups: each member's reward is its rollout index's rank over the group's size (so a
    row's reward says which group it was verified in), component `group_size`. Records each call
    with the sessions it saw open, and the rows written before it (`on_verify`)."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple[int, list[str], bool]] = []  # (task index, sessions, all open)
        self.on_verify: list[Any] = []

    async def describe_environment(self, environment: str) -> EnvDescription:
        return EnvDescription(tools=await self.environment_tools(environment), scores_groups=True)

    async def verify(self, environment: str, task: Any, messages: list[Any], session_id: str) -> Any:
        raise AssertionError("a group-scored environment is never verified one rollout at a time")

    async def verify_group(self, environment: str, task: Any, members: list[GroupMember]) -> list[Any]:
        sessions = [m.session_id for m in members]
        self.groups.append((int(task["task_index"]), sessions, all(s in self.sessions for s in sessions)))
        for hook in self.on_verify:
            hook(task)
        n = len(members)
        return [VerifyResult(reward=i / n, components={"group_size": float(n)}) for i in range(n)]


def _run(
    tmp_path: Path, env: GroupEnv, sink: MemorySink, model: LocalModel | None = None, **kw: Any
) -> JobRun:
    rows = Rows.arithmetic(4)
    for i, row in enumerate(rows.rows):
        row["task_index"] = i
    path = rows.write(tmp_path / "d.jsonl")
    spec = JobSpec(
        dataset=str(path),
        environment="arithmetic",
        num_repeats=3,
        retry=RetryPolicy(max_attempts=1, fail_fast_after=0),
        **kw,
    )
    return JobRun(
        "job-g",
        build_plan(CATALOG, spec),
        sink,
        model=model or LocalModel(),
        env=env,
        hooks=Hooks(sleep=_no_sleep),
        environment=EnvDescription(scores_groups=True),
    )


async def test_each_task_is_verified_once_as_a_group_then_written_together(tmp_path: Path) -> None:
    env, sink = GroupEnv(), MemorySink()
    written_before: list[int] = []
    env.on_verify.append(
        lambda task: written_before.append(sum(r.key.task_index == task["task_index"] for r in sink.rollouts))
    )
    run = _run(tmp_path, env, sink, concurrency=1)  # fewer slots than a group: held rollouts free theirs
    result = await run.run(await run.open())
    assert result.state == "SUCCEEDED", result
    assert sorted(t for t, _, _ in env.groups) == [0, 1, 2, 3]
    assert all(
        sessions == [f"job-g/{t}/{r}" for r in range(3)] and open_ for t, sessions, open_ in env.groups
    )
    assert written_before == [0, 0, 0, 0]  # no row of a task before its group's verdict
    assert sorted(r.key for r in sink.rollouts) == [RolloutKey(t, r) for t in range(4) for r in range(3)]
    for r in sink.rollouts:
        assert r.reward == r.key.rollout_index / 3 and r.reward_components == {"group_size": 3.0}
        assert not r.masked and "pending" not in r.verify_details
    assert sorted(env.closed) == sorted(f"job-g/{t}/{r}" for t in range(4) for r in range(3))
    assert run.progress.succeeded == 12 and run.progress.mean_reward == (0 + 1 / 3 + 2 / 3) / 3


async def test_a_group_is_held_until_its_last_rollout_is_done(tmp_path: Path) -> None:
    """Task 0's third rollout waits on a gate: its two siblings are done, yet nothing of task 0 is
    verified or written, and their sessions stay open; opening the gate releases the group."""
    gate = asyncio.Event()

    class Gated(LocalModel):
        async def generate(self, call: Any) -> Any:
            if call.request_id.startswith("job-g/0/2/"):
                await gate.wait()
            return await super().generate(call)

    env, sink = GroupEnv(), MemorySink()
    run = _run(tmp_path, env, sink, model=Gated(), concurrency=6)
    task = asyncio.create_task(run.run(await run.open()))
    for _ in range(200):  # until every other task is written (no sleep: each step yields once)
        if len(sink.rollouts) == 9:
            break
        await asyncio.sleep(0)
    assert {r.key.task_index for r in sink.rollouts} == {1, 2, 3} and len(sink.rollouts) == 9
    assert 0 not in [t for t, _, _ in env.groups]
    assert {"job-g/0/0", "job-g/0/1"} <= set(env.sessions)  # held open for the verdict
    gate.set()
    assert (await task).state == "SUCCEEDED"
    assert sorted(r.key for r in sink.rollouts if r.key.task_index == 0) == [
        RolloutKey(0, r) for r in range(3)
    ]
    assert not env.sessions


async def test_a_failed_rollout_fails_its_group_and_only_its_group(tmp_path: Path) -> None:
    class FailsOne(LocalModel):
        async def generate(self, call: Any) -> Any:
            if call.request_id.startswith("job-g/2/1/"):
                raise MalformedDatasetRow("injected: this rollout's prompt is refused")
            return await super().generate(call)

    env, sink = GroupEnv(), MemorySink()
    run = _run(tmp_path, env, sink, model=FailsOne(), concurrency=4)
    result = await run.run(await run.open())
    assert result.state == "COMPLETED_WITH_FAILURES" and "3 of 12" in result.error, result
    assert sorted(t for t, _, _ in env.groups) == [0, 1, 3]
    assert {r.key.task_index for r in sink.rollouts} == {0, 1, 3}
    failed = {f.key: f.error_class for f in sink.failures}
    assert failed == {
        RolloutKey(2, 0): "GROUP_MEMBER_FAILED",
        RolloutKey(2, 1): "MALFORMED_DATASET_ROW",
        RolloutKey(2, 2): "GROUP_MEMBER_FAILED",
    }
    assert "rollout 2:1 of this group failed" in next(
        f.message for f in sink.failures if f.key == RolloutKey(2, 0)
    )
    assert not env.sessions  # the failed group's held sessions were closed too


async def test_a_failed_group_verdict_fails_the_group(tmp_path: Path) -> None:
    class VerdictFails(GroupEnv):
        async def verify_group(self, environment: str, task: Any, members: list[GroupMember]) -> list[Any]:
            if task["task_index"] == 1:
                raise BadReward("injected: the judge answered NaN for the group")
            return await super().verify_group(environment, task, members)

    env, sink = VerdictFails(), MemorySink()
    run = _run(tmp_path, env, sink, concurrency=3)
    result = await run.run(await run.open())
    assert result.state == "COMPLETED_WITH_FAILURES", result
    assert sorted(f.key for f in sink.failures) == [RolloutKey(1, r) for r in range(3)]
    assert {f.error_class for f in sink.failures} == {"VERIFIER_BAD_REWARD"}
    assert {r.key.task_index for r in sink.rollouts} == {0, 2, 3} and not env.sessions


async def test_resume_runs_whole_groups_and_refuses_a_partly_stored_one(tmp_path: Path) -> None:
    """Task 0 stored whole: skipped. Task 1 stored in part: its missing key fails GROUP_PARTLY_STORED
    (never verified against a group its stored siblings were not in). Tasks 2 and 3: run as groups."""
    have = {RolloutKey(0, 0), RolloutKey(0, 1), RolloutKey(0, 2), RolloutKey(1, 0), RolloutKey(1, 2)}
    env, sink = GroupEnv(), MemorySink(existing=have)
    run = _run(tmp_path, env, sink, concurrency=2)
    result = await run.run(await run.open())
    assert result.state == "COMPLETED_WITH_FAILURES", result
    assert sorted(t for t, _, _ in env.groups) == [2, 3]
    assert sorted(r.key for r in sink.rollouts) == [RolloutKey(t, r) for t in (2, 3) for r in range(3)]
    assert [(f.key, f.error_class) for f in sink.failures] == [(RolloutKey(1, 1), "GROUP_PARTLY_STORED")]
    assert run.progress.skipped_existing == 5


async def test_a_stopped_run_writes_nothing_of_a_held_group_and_closes_its_sessions(tmp_path: Path) -> None:
    gate = asyncio.Event()

    class Hangs(LocalModel):
        async def generate(self, call: Any) -> Any:
            if call.request_id.startswith("job-g/0/2/"):
                await gate.wait()
            return await super().generate(call)

    env, sink = GroupEnv(), MemorySink()
    run = _run(tmp_path, env, sink, model=Hangs(), concurrency=3)
    task = asyncio.create_task(run.run(await run.open()))
    for _ in range(200):
        if {"job-g/0/0", "job-g/0/1"} <= set(env.sessions):
            break
        await asyncio.sleep(0)
    run.stop(RunResult("CANCELLED"))
    assert (await task).state == "CANCELLED"
    assert not any(r.key.task_index == 0 for r in sink.rollouts) and 0 not in [t for t, _, _ in env.groups]
    assert not any(s.startswith("job-g/0/") for s in env.sessions)
