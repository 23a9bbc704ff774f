"""`rollmesh serve openenv` on bridged environments: verifiers environments written in verifiers' own
API (tests/verifiers_envs/: `vf_rubric`, one turn scored by a rubric of three functions; `vf_counter`,
a StatefulToolEnv whose tools verifiers runs in its env_response) and NeMo Gym 0.4.0's own
example_session_state_mgmt server (tools through CallTool), each managed by a real verifier in its own
venv, served as OpenEnv servers and played by OpenEnv's own client from the OpenEnv venv. Each episode
is played again by rollmesh's own agent loop (`run_agent`, over the verifier's gRPC API, the actions
standing in for the model): the same messages after the prompt, the same finish reason, and rewards
that sum to the rollout's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.mesh.server import ServiceBinding
from rollmesh.openenv_server.server import openenv_server
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.scheduler.drivers.agent_loop import AgentOutcome
from rollmesh.scheduler.drivers.agent_loop import AgentSettings
from rollmesh.scheduler.drivers.agent_loop import GenerateCall
from rollmesh.scheduler.drivers.agent_loop import Turn
from rollmesh.scheduler.drivers.agent_loop import run_agent
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.conftest import StartServer
from tests.integration.test_openenv_serve import play
from tests.integration.test_verifiers_envs import ENVS
from tests.integration.test_verifiers_envs import vf_rows

Json = dict[str, Any]


async def _verifier(start_server: StartServer, root: Path) -> AsyncIterator[str]:
    """A verifier (gRPC, loopback) over the environments of the artifact root `root`."""
    roots = RootsConfig(Path("/nonexistent"), (root,), BUILTIN_ROOT, False)
    service = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await service.start()
    try:
        _, broken = service.list_environments()
        assert not broken, "; ".join(f"{b.name}: {b.error}" for b in broken)
        server = await start_server([ServiceBinding.of(VerifierServicer(service))])
        yield server.address
    finally:
        await service.aclose()


@pytest_asyncio.fixture
async def verifier(start_server: StartServer, tmp_path: Path, verifiers_python: Path) -> AsyncIterator[str]:
    """The verifiers environments `vf_rubric` and `vf_counter`, managed in the verifiers venv."""
    root = tmp_path / "root"
    for env_id in ("vf_rubric", "vf_counter"):
        folder = root / "environments" / env_id
        folder.mkdir(parents=True)
        toml = f'env_id = "{env_id}"\npython = "{verifiers_python}"\npaths = ["{ENVS}"]\n'
        (folder / "verifiers.toml").write_text(toml)
    async for address in _verifier(start_server, root):
        yield address


@pytest_asyncio.fixture
async def ng_verifier(start_server: StartServer, tmp_path: Path, nemo_gym_python: Path) -> AsyncIterator[str]:
    """NeMo Gym 0.4.0's example_session_state_mgmt server as `ng_counter`, managed in its venv."""
    folder = tmp_path / "root" / "environments" / "ng_counter"
    folder.mkdir(parents=True)
    (folder / "nemo_gym.toml").write_text(
        f'server = "example_session_state_mgmt"\npython = "{nemo_gym_python}"\n'
    )
    async for address in _verifier(start_server, tmp_path / "root"):
        yield address


def _assistant(action: Json, n: int) -> Json:
    """The assistant message the server makes of `action` (ids as it numbers calls without one)."""
    msg: Json = {"role": "assistant", "content": action.get("message", "")}
    calls = [
        {
            "id": f"call_{n + i}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for i, c in enumerate(action.get("tool_calls", []))
    ]
    return {**msg, "tool_calls": calls} if calls else msg


class Replay:
    """The agent loop's model port saying the episode's actions, one per turn."""

    def __init__(self, actions: list[Json]) -> None:
        self._turns, n = [], 0
        for action in actions:
            self._turns.append(_assistant(action, n))
            n += len(action.get("tool_calls", []))

    async def generate(self, call: GenerateCall) -> Turn:
        message = self._turns.pop(0)
        return Turn(message=message, finish_reason="tool_calls" if message.get("tool_calls") else "stop")

    async def close_session(self, session_id: str) -> None:
        return None

    async def engine_capacity(self, model: str) -> int:
        return 0


async def _loop_truth(address: str, environment: str, row: Json, actions: list[Json]) -> AgentOutcome:
    """The episode as rollmesh's own agent loop plays it, the actions standing in for the model."""
    env = VerifierEnv.connect(address)
    try:
        described = await env.describe_environment(environment)
        settings = AgentSettings(
            environment=environment,
            stateless=described.stateless,
            tool_calls_are_answer=described.tool_calls_are_answer,
        )
        return await run_agent(
            job_id="truth",
            key=RolloutKey(0, 0),
            task=row,
            seed=0,
            settings=settings,
            model=Replay(actions),
            env=env,
        )
    finally:
        await env.close()


def _check(ep: Json, actions: list[Json], truth: AgentOutcome) -> None:
    """The OpenEnv episode `ep` is the loop's rollout: the same messages after the prompt, the same
    finish reason, and rewards that sum to the rollout's."""
    assert "error" not in ep["reset"] and all("error" not in s for s in ep["steps"]), ep
    said, n = [], 0
    for action, step in zip(actions, ep["steps"], strict=True):
        said += [_assistant(action, n), *step["observation"]["messages"]]
        n += len(action.get("tool_calls", []))
    opening = len(truth.messages) - len(said)
    assert said == truth.messages[opening:]
    assert (
        ep["steps"][-1]["done"]
        and ep["steps"][-1]["observation"]["info"]["finish_reason"] == truth.finish_reason
    )
    assert sum(s["reward"] or 0.0 for s in ep["steps"]) == pytest.approx(truth.reward)


@pytest.mark.parametrize(
    ("environment", "plans"),
    [
        # vf_rubric's rows: 2 + 3, then 10 + 5. vf_counter's: 1 + 2, then 10 + 5.
        ("vf_rubric", [[{"message": "The answer is 5."}], [{"message": "I think 16"}]]),
        (
            "vf_counter",
            [
                [
                    {"tool_calls": [{"name": "increment", "arguments": {"by": 2}}]},
                    {"tool_calls": [{"name": "read", "arguments": {}}]},
                    {"message": "The counter is 3."},
                ],
                [
                    {"tool_calls": [{"name": "increment", "arguments": {"by": 1}}]},
                    {"message": "The counter is 9."},
                ],
            ],
        ),
    ],
)
async def test_a_verifiers_environment_plays_as_the_agent_loop_plays_it(
    verifier: str,
    verifiers_python: Path,
    openenv_python: Path,
    tmp_path: Path,
    environment: str,
    plans: list[list[Json]],
) -> None:
    rows = vf_rows(verifiers_python, environment)[: len(plans)]
    data = tmp_path / f"{environment}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    async with openenv_server(
        environment=environment, dataset=str(data), verifier=verifier, port=0, say=lambda _l: None
    ) as server:
        played = await play(
            openenv_python, server.url, [{"reset": {"index": i}, "actions": p} for i, p in enumerate(plans)]
        )
    for i, (ep, plan) in enumerate(zip(played, plans, strict=True)):
        _check(ep, plan, await _loop_truth(verifier, environment, rows[i], plan))
    finals = [ep["steps"][-1]["reward"] for ep in played]
    assert finals[0] > finals[1]  # the right answer scores above the wrong one


async def test_a_nemo_gym_environment_plays_as_the_agent_loop_plays_it(
    ng_verifier: str, nemo_gym_servers: Path, openenv_python: Path
) -> None:
    data = nemo_gym_servers / "example_session_state_mgmt" / "data" / "example.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines() if line][:2]

    def add(n: int) -> Json:
        return {"tool_calls": [{"name": "increment_counter", "arguments": {"count": n}}]}

    read = {"tool_calls": [{"name": "get_counter_value", "arguments": {}}]}
    # Row 0: 3, add 1, add 2 -> 6 (right). Row 1: 6, add 4 only -> 10, not 15 (wrong).
    plans = [[add(1), add(2), read, {"message": "6"}], [add(4), read, {"message": "10"}]]
    async with openenv_server(
        environment="ng_counter", dataset=str(data), verifier=ng_verifier, port=0, say=lambda _l: None
    ) as server:
        played = await play(
            openenv_python, server.url, [{"reset": {"index": i}, "actions": p} for i, p in enumerate(plans)]
        )
    for i, (ep, plan) in enumerate(zip(played, plans, strict=True)):
        _check(ep, plan, await _loop_truth(ng_verifier, "ng_counter", rows[i], plan))
    assert [ep["steps"][-1]["reward"] for ep in played] == [1.0, 0.0]
