"""Group scoring end to end: an in-process plugin whose reward is a rollout's rank within its task's
group (`verify_group`) in the real verifier over gRPC; the real gateway (fake backend) or the fake
gateway answering by the request's seed, so the rollouts of one task differ; the scheduler's job
manager, in process and as a scheduler process SIGKILLed while a group waits for its verdict.

Every row's reward is the rank its answer has among the stored answers of its own task: the group it
was verified in is exactly the group stored. Verify of one rollout alone is refused (GROUP_SCORED).
After the kill, the held group has no row; the resumed job runs it again whole, and every key is in
the folder exactly once, each with its group's verdict."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections import defaultdict
from collections.abc import AsyncIterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler import store
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.spec import JobSpec
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh.verifier.workers import WorkerPool
from rollmesh_client import Client
from rollmesh_client import FailedPreconditionError
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import scheduler_pb2 as pb
from rollmesh_client.v1 import verifier_pb2
from tests.conftest import StartServer
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.fakes import FakeGateway
from tests.procs import scheduler_proc

TASKS, REPEATS = 6, 4


def rank_rewards(texts: Sequence[str]) -> list[float]:
    """Each answer's rank by length among the group's distinct lengths, in [0, 1]."""
    sizes = sorted({len(t) for t in texts})
    top = max(len(sizes) - 1, 1)
    return [sizes.index(len(t)) / top for t in texts]


def answer(prompt: str, seed: int) -> str:
    """The fake model: an answer whose length depends on the task and the seed (rollout index)."""
    task = int(m.group(1)) if (m := re.search(r"Task (\d+)", prompt)) else 0
    return "x" * (1 + (seed * 3 + task) % 5)


@dataclass
class Rank(Environment):
    """Reward: the rollout's rank within its group (component `group_size`). A gate can hold the
    verdict of one task, to kill the scheduler while that group waits for it."""

    context: EnvContext
    calls: list[tuple[int, int]] = field(default_factory=list)  # (task, group size)
    gate_task: int = -1
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: asyncio.Event = field(default_factory=asyncio.Event)

    async def verify_group(
        self, task: Task, responses: Sequence[Response], sessions: Sequence[Session | None]
    ) -> list[VerifyResult]:
        index = int(task.row["index"])
        self.calls.append((index, len(responses)))
        if index == self.gate_task and not self.gate.is_set():
            self.waiting.set()
            await self.gate.wait()
        texts = [r.final_text for r in responses]
        return [
            VerifyResult(reward=r, components={"group_size": float(len(texts))}) for r in rank_rewards(texts)
        ]

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        raise AssertionError("the service refuses Verify on a group-scored environment")


def rows() -> list[dict[str, Any]]:
    return [
        {"responses_create_params": {"input": f"Task {i}: say something."}, "index": i} for i in range(TASKS)
    ]


@dataclass
class Mesh:
    rank: Rank
    gateway: GatewayServicer
    verifier_addr: str
    gateway_addr: str


@pytest_asyncio.fixture
async def mesh(start_server: StartServer) -> AsyncIterator[Mesh]:
    def plays(prompt_text: str, request: EngineRequest) -> str:
        return answer(prompt_text, int(request.sampling.seed or 0))

    gateway = Gateway([FakeBackend("tiny", script=plays, max_model_len=4096)])
    await gateway.start()
    cfg = VerifierConfig()
    rank = Rank(EnvContext("rank", None, cfg, WorkerPool(1)))
    service = VerifierService(cfg, Discovery({"rank": Loaded("rank", rank, "tests")}, {}))
    await service.start()
    gw = GatewayServicer(gateway)
    ver_server = await start_server([ServiceBinding.of(VerifierServicer(service))])
    gw_server = await start_server([ServiceBinding.of(gw)])
    try:
        yield Mesh(rank, gw, ver_server.address, gw_server.address)
    finally:
        await service.aclose()
        await gateway.shutdown()


def check_group_verdicts(directory: Path) -> list[Rollout]:
    """Every task's stored rows are its whole group, each rewarded with its rank in that group."""
    lines = (directory / store.ROLLOUTS).read_text().splitlines()
    got = [Rollout.from_row(json.loads(line)) for line in lines]
    by_task: dict[int, list[Rollout]] = defaultdict(list)
    for r in got:
        by_task[r.key.task_index].append(r)
    for task, group in by_task.items():
        group.sort(key=lambda r: r.key.rollout_index)
        assert [r.key.rollout_index for r in group] == list(range(REPEATS)), task
        texts = [str(r.messages[-1]["content"]) for r in group]
        assert [r.reward for r in group] == rank_rewards(texts), (task, texts)
        assert all(r.reward_components == {"group_size": float(REPEATS)} for r in group)
        assert len(set(texts)) > 1  # the group's answers differ: the ranks mean something
    return got


async def test_rewards_are_ranks_within_each_stored_group(mesh: Mesh, tmp_path: Path) -> None:
    data = tmp_path / "rank.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    model, env = GatewayModel.connect(mesh.gateway_addr), VerifierEnv.connect(mesh.verifier_addr)
    manager = JobManager(Catalog([Root(BUILTIN_ROOT, 0, "root")]), model=model, env=env)
    spec = JobSpec(
        dataset=str(data), environment="rank", num_repeats=REPEATS, concurrency=3, output_dir=str(tmp_path)
    )
    try:
        rec = await manager.wait((await manager.submit(spec)).job_id)
        assert rec.state == "SUCCEEDED", rec.to_json()
        got = check_group_verdicts(rec.directory)
    finally:
        await manager.aclose()
        await model.close()
        await env.close()
    assert len(got) == TASKS * REPEATS
    assert sorted(mesh.rank.calls) == [(t, REPEATS) for t in range(TASKS)]  # one verdict per group

    async with await Client.connect(verifier=mesh.verifier_addr) as c:
        described = await c.verifier.stub.GetEnvironment(verifier_pb2.GetEnvironmentRequest(name="rank"))
        assert described.scores_groups and described.stateless  # no session: each member has none
        results = await c.verifier.verify_group("rank", rows()[0], ["x", "xxx", "xx"])
        assert [r.reward for r in results] == [0.0, 1.0, 0.5]
        with pytest.raises(FailedPreconditionError) as refused:
            await c.verifier.verify("rank", rows()[0], "xx")
        assert refused.value.reason == "GROUP_SCORED"


async def test_sigkill_while_a_group_waits_for_its_verdict_then_resume(
    mesh: Mesh, start_server: StartServer, tmp_path: Path
) -> None:
    def script(req: gateway_pb2.GenerateRequest, turn: int) -> dict[str, Any]:
        prompt = next((m.content for m in req.messages if m.role == "user"), "")
        return {"content": answer(prompt, req.sampling.seed)}

    fake_gw = await start_server([FakeGateway(script=script).binding()])
    env = {"ROLLMESH_GATEWAY_ADDR": fake_gw.address, "ROLLMESH_VERIFIER_ADDR": mesh.verifier_addr}
    data = tmp_path / "rank.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    runs = tmp_path / "runs"
    spec = pb.JobSpec(
        dataset=str(data),
        environment="rank",
        num_repeats=REPEATS,
        concurrency=REPEATS,
        output_dir=str(runs),
        sink=pb.SinkSpec(jsonl=pb.JsonlSinkSpec(fsync_every=1)),
    )
    mesh.rank.gate_task = 2
    async with scheduler_proc(tmp_path, "first", env) as (proc, address):
        async with await Client.connect(scheduler=address) as c:
            job = await c.scheduler.submit(spec)
            async with asyncio.timeout(60):
                await mesh.rank.waiting.wait()  # task 2's rollouts are all done; its verdict is held
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
    job_id = job.job_id
    before = check_exactly_once(runs / job_id, expected_keys(TASKS, REPEATS), complete=False)
    assert 2 not in {t for t, _ in before.rollout_keys}  # no row of the held group without its verdict
    check_group_verdicts(runs / job_id)  # and what is stored is whole groups, each with its verdict

    mesh.rank.gate.set()
    async with scheduler_proc(tmp_path, "second", env) as (_, address):
        async with await Client.connect(scheduler=address) as c:
            resumed = await c.scheduler.submit(
                pb.JobSpec(
                    dataset=str(data),
                    environment="rank",
                    num_repeats=REPEATS,
                    concurrency=REPEATS,
                    output_dir=str(runs),
                    resume_job_id=job_id,
                )
            )
            final = await resumed.result(poll_s=0.05, timeout_s=120)
            assert pb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED", final.error
            assert final.progress.skipped_existing == len(before.rollout_keys)
    truth = check_exactly_once(runs / job_id, expected_keys(TASKS, REPEATS), job=final)
    assert len(truth.rollout_keys) == TASKS * REPEATS and not truth.failure_keys
    check_group_verdicts(runs / job_id)
    calls = [t for t, _ in mesh.rank.calls]
    assert calls.count(2) == 2 and set(calls) == set(range(TASKS))  # the held group: verified again, whole
