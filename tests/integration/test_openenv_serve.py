"""`rollmesh serve openenv` driven by OpenEnv's own client: a real verifier (gRPC, loopback) holding
the built-in `arithmetic` (one turn), `reasoning_gym` (generated rows) and `session_state` (tools,
per-session state) environments and tests/games.py's number-guessing game (environment turns), each
served as an OpenEnv server (rollmesh/openenv_server) on an ephemeral loopback port, and played by
openenv-core's `GenericEnvClient` over its WebSocket session from the OpenEnv venv
(tests/openenv_envs/own_client.py, scripts/openenv_venv.py). Every reward, `done` and observation is
compared with what rollmesh's own verifier answers for the same row and the same turns through the
SDK (seed, call_tool, step, verify). Hostile input: an action the schema refuses, a step before any
reset and after the end, raw frames that are not JSON, an unknown message type, and auth: no token
and a wrong one are refused at the handshake; the right one (openenv 0.10's client sends headers)
plays."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import websockets

from rollmesh.mesh.server import ServiceBinding
from rollmesh.openenv_server.server import OpenEnvServer
from rollmesh.openenv_server.server import openenv_server
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.scheduler.plan import load_rows
from rollmesh.verifier import Environment
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.loader import environment_class
from rollmesh.verifier.loader import import_file
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh.verifier.workers import WorkerPool
from rollmesh_client import Client
from tests.conftest import StartServer
from tests.games import Guess
from tests.games import guess_row
from tests.games import guesses_to_find
from tests.games import score
from tests.openenv_servers import own_client

ENVS = BUILTIN_ROOT / "environments"
KEY = "openenv-test-key"

Json = dict[str, Any]


def _rows(name: str) -> list[Json]:
    return [
        json.loads(line) for line in (ENVS / name / "data" / "example.jsonl").read_text().splitlines() if line
    ]


@dataclass
class Verifier:
    address: str
    api_key: str


async def _verifier(start_server: StartServer, api_key: str) -> AsyncIterator[Verifier]:
    cfg = VerifierConfig()

    def builtin(name: str) -> Environment:
        path = ENVS / name / "env.py"
        return environment_class(import_file(path))(EnvContext(name, path.parent, cfg, WorkerPool(1)))

    envs: dict[str, Environment] = {
        "arithmetic": builtin("arithmetic"),
        "session_state": builtin("session_state"),
        "reasoning_gym": builtin("reasoning_gym"),
        "guess": Guess(EnvContext("guess", None, cfg, WorkerPool(1))),
    }
    service = VerifierService(cfg, Discovery({n: Loaded(n, e, "tests") for n, e in envs.items()}, {}))
    await service.start()
    try:
        server = await start_server([ServiceBinding.of(VerifierServicer(service))], api_key=api_key)
        yield Verifier(server.address, api_key)
    finally:
        await service.aclose()


@pytest_asyncio.fixture
async def verifier(start_server: StartServer) -> AsyncIterator[Verifier]:
    async for v in _verifier(start_server, ""):
        yield v


@pytest_asyncio.fixture
async def keyed_verifier(start_server: StartServer) -> AsyncIterator[Verifier]:
    async for v in _verifier(start_server, KEY):
        yield v


Serve = Callable[..., Any]


@pytest_asyncio.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """`url = await serve(verifier, environment, dataset=..., api_key=...)`: an OpenEnv server on an
    ephemeral loopback port, stopped after the test."""
    async with AsyncExitStack() as stack:

        async def start(
            v: Verifier, environment: str, *, dataset: str = "", max_steps: int = 8, max_sessions: int = 0
        ) -> str:
            if not dataset and environment != "guess":
                dataset = str(ENVS / environment / "data" / "example.jsonl")
            server: OpenEnvServer = await stack.enter_async_context(
                openenv_server(
                    environment=environment,
                    dataset=dataset,
                    verifier=v.address,
                    api_key=v.api_key,
                    port=0,
                    max_steps=max_steps,
                    max_sessions=max_sessions,
                    say=lambda _line: None,
                )
            )
            return server.url

        yield start


async def play(
    python: Path, url: str, episodes: list[Json], headers: dict[str, str] | None = None
) -> list[Json]:
    """The episodes played by OpenEnv's own client (tests/openenv_envs/own_client.py), one session each."""
    jobs = [{**ep, "headers": headers} if headers else ep for ep in episodes]
    results: list[Json] = await own_client(python, "play", url, jobs)
    return results


async def test_single_turn_rewards_equal_the_verifiers(
    verifier: Verifier, serve: Serve, openenv_python: Path
) -> None:
    url = await serve(verifier, "arithmetic")
    rows = _rows("arithmetic")[:3]
    answers = [[str(r["expected_answer"])] for r in rows] + [["no idea"] for _ in rows]
    episodes = [
        {"reset": {"index": i % 3}, "actions": [{"message": a[0]}], "state": True}
        for i, a in enumerate(answers)
    ]
    played = await play(openenv_python, url, episodes)
    async with await Client.connect(verifier=verifier.address) as c:
        for i, (ep, a) in enumerate(zip(played, answers, strict=True)):
            row = rows[i % 3]
            assert ep["reset"] == {
                "observation": {"messages": row["responses_create_params"]["input"], "tools": [], "info": {}},
                "reward": None,
                "done": False,
            }
            want = await c.verifier.verify("arithmetic", row, a[0])
            (step,) = ep["steps"]
            assert step["done"] is True
            assert step["reward"] == pytest.approx(want.reward)
            info = step["observation"]["info"]
            assert info["extracted_answer"] == want.extracted_answer
            assert info["reward_components"] == dict(want.components)
            assert info["finish_reason"] == "stop"
            assert step["observation"]["messages"] == []
            assert ep["state"]["step_count"] == 1 and ep["state"]["done"] is True
            assert ep["state"]["task_index"] == i % 3
    assert [ep["steps"][0]["reward"] for ep in played] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


async def test_generated_reasoning_gym_rows_score_as_the_verifier_scores_them(
    verifier: Verifier, serve: Serve, openenv_python: Path
) -> None:
    spec = BUILTIN_ROOT / "datasets" / "reasoning_gym_arith" / "reasoning_gym.json"
    url = await serve(verifier, "reasoning_gym", dataset=str(spec))
    rows = load_rows(spec)[:4]
    answers = [str(r["answer"]) if i % 2 == 0 else "0" for i, r in enumerate(rows)]
    played = await play(
        openenv_python,
        url,
        [{"reset": {"index": i}, "actions": [{"message": a}]} for i, a in enumerate(answers)],
    )
    async with await Client.connect(verifier=verifier.address) as c:
        for row, answer, ep in zip(rows, answers, played, strict=True):
            assert ep["reset"]["observation"]["messages"] == row["responses_create_params"]["input"]
            want = await c.verifier.verify("reasoning_gym", row, answer)
            assert ep["steps"][0]["reward"] == pytest.approx(want.reward) and ep["steps"][0]["done"] is True
    assert [ep["steps"][0]["reward"] for ep in played][::2] == [1.0, 1.0]  # the generator's own answers


async def test_tool_episodes_keep_session_state_as_the_verifier_does(
    verifier: Verifier, serve: Serve, openenv_python: Path
) -> None:
    url = await serve(verifier, "session_state")
    rows = _rows("session_state")[:2]

    def call(by: int, id_: str) -> Json:
        return {"id": id_, "name": "increment_counter", "arguments": {"count": by}}

    # Row 0 (0 -> 3): right in two calls, OpenAI's call shape for the second; row 1 (5 -> 7): wrong.
    plans = [
        [
            {"tool_calls": [call(1, "a")]},
            {
                "tool_calls": [
                    {
                        "id": "b",
                        "type": "function",
                        "function": {"name": "increment_counter", "arguments": '{"count": 2}'},
                    }
                ]
            },
            {"message": "3"},
        ],
        [{"tool_calls": [call(1, "c")]}, {"message": "6"}],
    ]
    episodes = [{"reset": {"index": i}, "actions": p} for i, p in enumerate(plans)]
    played = await play(openenv_python, url, episodes)
    async with await Client.connect(verifier=verifier.address) as c:
        for i, (ep, plan) in enumerate(zip(played, plans, strict=True)):
            assert sorted(t["name"] for t in ep["reset"]["observation"]["tools"]) == [
                "get_counter_value",
                "increment_counter",
            ]
            sid = f"truth-{i}"
            await c.verifier.seed_session("session_state", rows[i], session_id=sid)
            for action, got in zip(plan[:-1], ep["steps"][:-1], strict=True):
                tc = action["tool_calls"][0]
                fn = tc.get("function", tc)
                args = fn["arguments"]
                want = await c.verifier.call_tool(sid, fn["name"], args, call_id=tc["id"])
                assert got["observation"]["messages"] == [
                    {
                        "role": "tool",
                        "tool_call_id": tc["id"],
                        "name": "increment_counter",
                        "content": want.output,
                    }
                ]
                assert got["reward"] is None and got["done"] is False
            verdict = await c.verifier.verify("session_state", rows[i], plan[-1]["message"], session_id=sid)
            await c.verifier.close_session(sid)
            last = ep["steps"][-1]
            assert last["done"] is True and last["reward"] == pytest.approx(verdict.reward)
    assert [ep["steps"][-1]["reward"] for ep in played] == [1.0, 0.0]


async def test_environment_turns_rewards_sum_to_the_rollouts(
    verifier: Verifier, serve: Serve, openenv_python: Path, tmp_path: Path
) -> None:
    secrets = (37, 88)
    data = tmp_path / "guess.jsonl"
    data.write_text("".join(json.dumps(guess_row(s)) + "\n" for s in secrets))
    url = await serve(verifier, "guess", dataset=str(data), max_steps=20)
    plans = [[{"message": str(g)} for g in guesses_to_find(s)] for s in secrets]
    episodes = [{"reset": {"seed": i}, "actions": p, "state": True} for i, p in enumerate(plans)]
    played = await play(openenv_python, url, episodes)
    async with await Client.connect(verifier=verifier.address) as c:
        for i, (ep, plan) in enumerate(zip(played, plans, strict=True)):
            sid = f"truth-{i}"
            seeded = await c.verifier.seed_session("guess", guess_row(secrets[i]), session_id=sid)
            opening = [{"role": m.role, "content": m.content} for m in seeded.messages]
            assert ep["reset"]["observation"]["messages"] == [
                {"role": "user", "content": "Let's play a game."},
                *opening,
            ]
            assert [t["name"] for t in ep["reset"]["observation"]["tools"]] == ["hint", "peek"]
            total = 0.0
            for action, got in zip(plan, ep["steps"], strict=True):
                want = await c.verifier.step(sid, action["message"])
                assert got["observation"]["messages"] == [
                    {"role": m.role, "content": m.content} for m in want.messages
                ]
                total += got["reward"]
                if want.done:
                    verdict = await c.verifier.verify(
                        "guess", guess_row(secrets[i]), plan[-1]["message"], session_id=sid
                    )
                    assert got["reward"] == pytest.approx(want.reward + verdict.reward)
                    assert got["done"] is True
                else:
                    assert got["reward"] == pytest.approx(want.reward) and got["done"] is False
            await c.verifier.close_session(sid)
            assert total == pytest.approx(score(secrets[i]))
            assert ep["state"]["reward"] == pytest.approx(total)
            assert ep["state"]["step_count"] == len(plan)


async def test_an_episode_not_done_at_max_steps_is_verified_there(
    verifier: Verifier, serve: Serve, openenv_python: Path, tmp_path: Path
) -> None:
    data = tmp_path / "guess.jsonl"
    data.write_text(json.dumps(guess_row(37)) + "\n")
    url = await serve(verifier, "guess", dataset=str(data), max_steps=2)
    (ep,) = await play(
        openenv_python,
        url,
        [{"reset": {}, "actions": [{"message": "1"}, {"message": "2"}, {"message": "37"}]}],
    )
    first, second, third = ep["steps"]
    assert first["done"] is False and first["reward"] == pytest.approx(-0.125)
    assert second["done"] is True and second["reward"] == pytest.approx(-0.125)  # verify: not won, 0
    assert second["observation"]["info"]["finish_reason"] == "max_steps"
    assert "OPENENV_NO_EPISODE" in third["error"] and "the episode is over" in third["error"]


async def test_hostile_input_is_one_line_and_the_session_goes_on(
    verifier: Verifier, serve: Serve, openenv_python: Path
) -> None:
    url = await serve(verifier, "arithmetic")
    row = _rows("arithmetic")[0]
    bad_actions = [{"message": 5}, {"tool_calls": "none"}, {"answer": "60"}, {"tool_calls": [{"name": ""}]}]
    episodes = [
        {"reset": None, "actions": [{"message": "60"}]},  # a step before any reset
        {"reset": {"index": 0}, "actions": [*bad_actions, {"message": str(row["expected_answer"])}]},
        {"reset": {"index": 10**6}},
        {"reset": {"difficulty": "hard"}},
    ]
    before, bad, past, unknown = await play(openenv_python, url, episodes)
    assert (
        "OPENENV_NO_EPISODE" in before["steps"][0]["error"]
        and "no episode was started" in before["steps"][0]["error"]
    )
    for got in bad["steps"][:-1]:
        assert "VALIDATION_ERROR" in got["error"] and "OPENENV_BAD_ACTION" in got["error"]
        assert "\n" not in got["error"]
    assert bad["steps"][-1]["reward"] == 1.0 and bad["steps"][-1]["done"] is True  # the episode went on
    assert "past the dataset's 10 rows" in past["reset"]["error"]
    assert "OPENENV_BAD_RESET" in unknown["reset"]["error"] and "difficulty" in unknown["reset"]["error"]

    ws_url = url.replace("http://", "ws://") + "/ws"
    async with websockets.connect(ws_url) as ws:
        answers = []
        for frame in ("{not json", "[1, 2]", json.dumps({"type": "launch"}), json.dumps({"type": "step"})):
            await ws.send(frame)
            answers.append(json.loads(await ws.recv()))
        await ws.send(json.dumps({"type": "state"}))
        state = json.loads(await ws.recv())
    assert [a["data"]["code"] for a in answers] == [
        "INVALID_JSON",
        "INVALID_JSON",
        "UNKNOWN_TYPE",
        "VALIDATION_ERROR",
    ]
    assert state == {
        "type": "state",
        "data": {
            "episode_id": None,
            "step_count": 0,
            "environment": "arithmetic",
            "task_index": None,
            "done": False,
            "reward": 0.0,
        },
    }


async def test_sessions_past_max_sessions_are_refused_at_capacity_until_one_closes(
    verifier: Verifier, serve: Serve, openenv_python: Path
) -> None:
    url = await serve(verifier, "arithmetic", max_sessions=1)
    ws_url = url.replace("http://", "ws://") + "/ws"
    async with websockets.connect(ws_url) as held:
        await held.send(json.dumps({"type": "reset", "data": {"index": 0}}))
        assert json.loads(await held.recv())["type"] == "observation"
        async with websockets.connect(ws_url) as extra:
            await extra.send(json.dumps({"type": "reset", "data": {}}))
            refused = json.loads(await extra.recv())
        assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED"
        assert (refused["data"]["active_sessions"], refused["data"]["max_sessions"]) == (1, 1)
        (theirs,) = await play(openenv_python, url, [{"reset": {"index": 0}}])  # OpenEnv's client sees it too
        assert "CAPACITY_REACHED" in theirs["reset"]["error"]
        await held.send(json.dumps({"type": "step", "data": {"message": "60"}}))  # the held one plays on
        assert json.loads(await held.recv())["data"]["reward"] == 1.0
    # Closed: its slot is free once the server has seen the close (waited on, not slept on).
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        (again,) = await play(openenv_python, url, [{"reset": {"index": 1}}])
        if "error" not in again["reset"] or asyncio.get_running_loop().time() > deadline:
            break
    assert (
        again["reset"]["observation"]["messages"]
        == _rows("arithmetic")[1]["responses_create_params"]["input"]
    )


async def test_auth_refuses_a_missing_or_wrong_token_and_plays_with_the_right_one(
    keyed_verifier: Verifier, serve: Serve, openenv_python: Path, openenv_010_python: Path
) -> None:
    url = await serve(keyed_verifier, "arithmetic")
    episode = [
        {"reset": {"index": 1}, "actions": [{"message": str(_rows("arithmetic")[1]["expected_answer"])}]}
    ]
    (none,) = await play(openenv_python, url, episode)  # openenv-core 0.3's client sends no headers
    (wrong,) = await play(openenv_010_python, url, episode, {"Authorization": "Bearer nope"})
    (right,) = await play(openenv_010_python, url, episode, {"Authorization": f"Bearer {KEY}"})
    for refused in (none, wrong):
        assert "403" in refused["connect_error"], refused
    assert right["steps"][0]["reward"] == 1.0 and right["steps"][0]["done"] is True
    async with httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/health")).json() == {"status": "healthy"}  # probes need no token
        refused = await http.get("/schema")
        assert refused.status_code == 401 and "bearer token" in refused.json()["detail"]
        schema = await http.get("/schema", headers={"Authorization": f"Bearer {KEY}"})
        assert set(schema.json()) == {"action", "observation", "state"}
