"""`rollmesh serve openenv` on bridged environments: verifiers environments written in verifiers' own
API (tests/verifiers_envs/: `vf_rubric`, one turn scored by a rubric of three functions; `vf_counter`,
a StatefulToolEnv whose tools verifiers runs in its env_response) behind a real verifier that manages
each in the verifiers venv, served as OpenEnv servers and played by OpenEnv's own client from the
OpenEnv venv. Each episode is played again through the verifier's environment API as the scheduler's
agent loop calls it (`VerifierEnv`: seed, step, verify, over gRPC): every step's reward, `done` and
messages, and the final reward, are the same."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.mesh.server import ServiceBinding
from rollmesh.openenv_server.server import openenv_server
from rollmesh.registry import BUILTIN_ROOT, Catalog, RootsConfig
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.conftest import StartServer
from tests.integration.test_openenv_serve import play
from tests.integration.test_verifiers_envs import ENVS, vf_rows

Json = dict[str, Any]


@pytest_asyncio.fixture
async def verifier(start_server: StartServer, tmp_path: Path, verifiers_python: Path) -> AsyncIterator[str]:
    root = tmp_path / "root"
    for env_id in ("vf_rubric", "vf_counter"):
        folder = root / "environments" / env_id
        folder.mkdir(parents=True)
        toml = f'env_id = "{env_id}"\npython = "{verifiers_python}"\npaths = ["{ENVS}"]\n'
        (folder / "verifiers.toml").write_text(toml)
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


async def _loop_truth(address: str, environment: str, row: Json, actions: list[Json], sid: str) -> list[Json]:
    """The episode through the verifier's API as the agent loop calls it: each step's reward, done
    and messages."""
    env = VerifierEnv.connect(address)
    try:
        await env.seed_session(environment, row, sid)
        new: list[Json] = []
        out, n = [], 0
        for action in actions:
            msg = _assistant(action, n)
            n += len(action.get("tool_calls", []))
            new.append(msg)
            step = await env.step(sid, [msg])
            new.extend(step.messages)
            reward = step.reward
            if step.done:
                reward += (await env.verify(environment, row, new, sid)).reward
            out.append({"reward": reward, "done": step.done, "messages": step.messages})
            if step.done:
                break
        await env.close_session(sid)
        return out
    finally:
        await env.close()


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
        assert "error" not in ep["reset"], ep
        truth = await _loop_truth(verifier, environment, rows[i], plan, f"truth-{i}")
        got = [
            {"reward": s["reward"], "done": s["done"], "messages": s["observation"]["messages"]}
            for s in ep["steps"]
        ]
        assert got[: len(truth)] == [{**t, "reward": pytest.approx(t["reward"])} for t in truth], (
            f"{environment} row {i}"
        )
        assert truth[-1]["done"] and len(got) == len(truth)
    finals = [ep["steps"][-1]["reward"] for ep in played]
    assert finals[0] > finals[1]  # the right answer scores above the wrong one
