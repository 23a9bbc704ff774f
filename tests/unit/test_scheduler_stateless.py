"""Stateless environments: a rollout is Generate -> Verify (no SeedSession/CloseSession), unless the row
declares tools of its own; stateful environments keep their sessions. Fake ports, no gRPC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.drivers.agent_loop import run_agent
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.spec import JobSpec
from tests.fakes import LocalEnv
from tests.fakes import LocalModel
from tests.fakes import MemorySink
from tests.fakes import Rows

CATALOG = Catalog([Root(BUILTIN_ROOT, 0, "root")])


class CountingEnv(LocalEnv):
    """LocalEnv that says which environments are stateless and records every session RPC."""

    def __init__(self, stateless: set[str]) -> None:
        super().__init__()
        self.stateless = stateless
        self.seeded: list[str] = []
        self.verified_with: list[str] = []
        self.described = 0

    async def describe_environment(self, environment: str) -> EnvDescription:
        self.described += 1
        tools = await self.environment_tools(environment)
        return EnvDescription(tools=tools, stateless=environment in self.stateless)

    async def seed_session(self, environment: str, task: Any, session_id: str) -> Any:
        self.seeded.append(session_id)
        return await super().seed_session(environment, task, session_id)

    async def verify(self, environment: str, task: Any, messages: list[Any], session_id: str) -> Any:
        self.verified_with.append(session_id)
        return await super().verify(environment, task, messages, session_id)


def _task(*, tools: list[Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"input": [{"role": "user", "content": "What is 1 + 2?"}]}
    if tools is not None:
        params["tools"] = tools
    return {"responses_create_params": params, "expected_answer": "3"}


async def _rollout(env: CountingEnv, task: dict[str, Any], *, stateless: bool) -> Any:
    return await run_agent(
        job_id="j",
        key=RolloutKey(1, 0),
        task=task,
        seed=0,
        settings=AgentSettings(environment="arithmetic", max_steps=1, stateless=stateless),
        model=LocalModel(),
        env=env,
    )


async def test_stateless_rollout_is_generate_then_verify() -> None:
    env = CountingEnv({"arithmetic"})
    out = await _rollout(env, _task(), stateless=True)
    assert out.verdict.reward == 1.0 and len(out.turns) == 1
    assert env.seeded == [] and env.closed == [] and env.verified_with == [""]


async def test_stateful_rollout_still_seeds_and_closes() -> None:
    env = CountingEnv(set())
    out = await _rollout(env, _task(), stateless=False)
    assert out.verdict.reward == 1.0
    assert env.seeded == ["j/1/0"] and env.closed == ["j/1/0"] and env.verified_with == ["j/1/0"]


async def test_row_tools_keep_the_session_in_a_stateless_environment() -> None:
    env = CountingEnv({"arithmetic"})
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    out = await _rollout(env, _task(tools=[tool]), stateless=True)
    assert out.verdict.reward == 1.0
    assert env.seeded == ["j/1/0"] and env.closed == ["j/1/0"] and env.verified_with == ["j/1/0"]


async def test_manager_describes_once_per_job_and_skips_sessions(tmp_path: Path) -> None:
    path = Rows.arithmetic(5).write(tmp_path / "d.jsonl")
    for stateless, sessions in ((set(), 15), ({"arithmetic"}, 0)):
        env = CountingEnv(stateless)
        sink = MemorySink()
        mgr = JobManager(
            CATALOG, model=LocalModel(), env=env, output_dir=str(tmp_path), sink_factory=lambda *_, s=sink: s
        )
        try:
            spec = JobSpec(
                dataset=str(path), environment="arithmetic", num_repeats=3, output_dir=str(tmp_path)
            )
            rec = await mgr.wait((await mgr.submit(spec)).job_id)
        finally:
            await mgr.aclose()
        assert rec.state == "SUCCEEDED" and len(sink.rollouts) == 15
        assert all(r.reward == 1.0 for r in sink.rollouts)
        assert env.described == 1
        assert len(env.seeded) == len(env.closed) == sessions
        assert len(env.verified_with) == 15 and ("" in env.verified_with) == (sessions == 0)
