"""OpenEnv environments hosted by rollmesh (verifier/bridges/openenv_env.py), against real OpenEnv
servers in the OpenEnv virtualenv on 127.0.0.1 ephemeral ports, driven through the real verifier over
gRPC; conformance: the same actions given to OpenEnv's own client (`GenericEnvClient`, its WebSocket
session) on the same server give the same rewards, `done` and observations.

- `openenv init`'s template (generated here, offline), managed by the verifier from its folder: the
  model's text is the action (`message`).
- tests/openenv_envs/guess_env, written with openenv-core's API (multi-step, a reward that depends
  on each guess), attached by URL: a tool call is the action (`guess`, an integer).
- tests/openenv_envs/counter_mcp_env, an MCP environment (MCPEnvironment over FastMCP): its listed
  tools are the session's, a call to one is its CallToolAction.
- A job (the scheduler's job manager, the real gateway with the fake model playing guess_env by
  binary search) records each episode's steps, and `rollmesh reverify` replays them to the same
  rewards.
- A managed server killed under an episode: restarted on its address, the episode lost by name.
- Named failures: a server that is not there, one that dies under an episode, a schema the action
  cannot be built for, the environment's step raising, observations that are not ones, a server
  at its session limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
from collections.abc import AsyncIterator
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from rollmesh.commands._reverify import reverify
from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.registry import RootsConfig
from rollmesh.scheduler import store
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.openenv_env import OpenEnvEnvironment
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import Client
from rollmesh_client import RollmeshClientError
from rollmesh_client.v1 import common_pb2
from tests.conftest import StartServer
from tests.http_apps import serve_app
from tests.openenv_servers import COUNTER_MCP_ENV
from tests.openenv_servers import GUESS_ENV
from tests.openenv_servers import init_template
from tests.openenv_servers import own_client
from tests.openenv_servers import serve

pytestmark = pytest.mark.timeout(600)

EMPTY = {"responses_create_params": {"input": []}}


@contextlib.asynccontextmanager
async def verifier(
    tmp_path: Path, start_server: StartServer, tomls: Mapping[str, str]
) -> AsyncIterator[tuple[Client, VerifierService]]:
    """A verifier serving an artifact root of `tomls` (environment name -> openenv.toml) over gRPC."""
    root = tmp_path / "root"
    for name, text in tomls.items():
        (root / "environments" / name).mkdir(parents=True)
        (root / "environments" / name / "openenv.toml").write_text(text)
    roots = RootsConfig(Path("/nonexistent"), (root,), BUILTIN_ROOT, False)
    service = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await service.start()
    try:
        server = await start_server([ServiceBinding.of(VerifierServicer(service))])
        async with await Client.connect(verifier=server.address) as client:
            yield client, service
    finally:
        await service.aclose()


def bridge(service: VerifierService, name: str) -> OpenEnvEnvironment:
    env = service.environment(name)
    assert isinstance(env, OpenEnvEnvironment)
    return env


def call(call_id: str, name: str, arguments: Mapping[str, Any] | str) -> common_pb2.ChatMessage:
    """An assistant turn calling `name`."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    tool_call = common_pb2.ToolCall(id=call_id, name=name, arguments_json=args)
    return common_pb2.ChatMessage(role="assistant", content="", tool_calls=[tool_call])


def same_as_own(ours: list[Any], theirs: list[dict[str, Any]]) -> None:
    """Each of our StepResponses answers as OpenEnv's client's step result: reward, done, observation."""
    assert len(ours) == len(theirs)
    for step, own in zip(ours, theirs, strict=True):
        info = json.loads(step.info_json)
        assert info["observation"] == own["observation"]
        assert info["reward"] == own["reward"] and step.reward == (own["reward"] or 0.0)
        assert step.done is own["done"]


async def test_the_openenv_init_template_answers_the_bridge_as_it_answers_openenvs_own_client(
    tmp_path: Path, start_server: StartServer, openenv_python_each: Path
) -> None:
    env_dir = init_template(openenv_python_each, tmp_path / "envs")
    toml = f'env_dir = "{env_dir}"\npython = "{openenv_python_each}"\n'
    texts = ["Hello", "a longer message, echoed back", ""]
    async with verifier(tmp_path, start_server, {"echo": toml}) as (client, service):
        described = await client.verifier.get("echo")
        assert described.takes_turns and "managed by the verifier" in described.description
        seeded = await client.verifier.seed_session("echo", EMPTY, session_id="ep")
        assert seeded.takes_turns and not seeded.session_tools  # the text is the action: no tool
        ours = [await client.verifier.step("ep", text) for text in texts]
        verdict = await client.verifier.verify("echo", EMPTY, texts[-1], session_id="ep")
        await client.verifier.close_session("ep")
        sidecar = bridge(service, "echo").sidecar
        assert sidecar is not None
        theirs = await own_client(
            openenv_python_each,
            "play",
            f"http://{sidecar.address}",
            {"actions": [{"message": t} for t in texts]},
        )
    # reset's observation is the prompt; each text went as {"message": text}, 0.1 per character
    assert json.loads(seeded.messages[0].content) == theirs["reset"]["observation"]
    assert seeded.messages[0].role == "user"
    same_as_own(ours, theirs["steps"])
    cap = 1.0 if "openenv-0.10" in str(openenv_python_each) else float("inf")  # 0.10's template caps it
    assert [s.reward for s in ours] == pytest.approx([min(0.1 * len(t), cap) for t in texts])
    assert [json.loads(s.messages[0].content)["echoed_message"] for s in ours] == texts
    assert verdict.reward == 0.0 and json.loads(verdict.details_json) == {"done": False, "steps": 3}


def secret_of(seed: int) -> int:
    """guess_env's secret for reset's `seed` (the same CPython random in both virtualenvs)."""
    return random.Random(seed).randint(1, 100)


async def test_an_environment_of_our_own_attached_by_url_plays_as_with_openenvs_own_client(
    tmp_path: Path, start_server: StartServer, openenv_python_each: Path
) -> None:
    """A binary search over guess_env's hints through the bridge (tool calls; a turn with no call and
    one with bad arguments in between, answered to the model and sent nowhere), then the same guesses
    through OpenEnv's client on the same server: the same rewards (each depends on the guess), the same
    `done` and observations, the episode over at the right guess."""
    seed, row = 13, {**EMPTY, "verifier_metadata": {"reset": {"seed": 13}}}  # secret 34: the 5th guess
    async with serve(openenv_python_each, GUESS_ENV, tmp_path / "guess.log") as url:
        async with verifier(tmp_path, start_server, {"guess": f'url = "{url}"\n'}) as (client, _):
            seeded = await client.verifier.seed_session("guess", row, session_id="ep")
            assert [t.name for t in seeded.session_tools] == ["act"]
            assert json.loads(seeded.session_tools[0].parameters_json)["required"] == ["guess"]
            opening = json.loads(seeded.messages[0].content)
            assert opening["attempts_left"] == 6 and opening["episode_id"] == "ep"  # the session's id
            idle = await client.verifier.step("ep", "I think it is 40.")
            bad = await client.verifier.step("ep", [call("c0", "act", {"guess": "forty"})])
            low, high, guesses, ours = 1, 100, [], []
            while not (ours and ours[-1].done):
                guesses.append((low + high) // 2)
                ours.append(
                    await client.verifier.step(
                        "ep", [call(f"c{len(ours) + 1}", "act", {"guess": guesses[-1]})]
                    )
                )
                hint = json.loads(ours[-1].messages[0].content)["hint"]
                low, high = (guesses[-1] + 1, high) if hint == "higher" else (low, guesses[-1] - 1)
            await client.verifier.close_session("ep")
        theirs = await own_client(
            openenv_python_each,
            "play",
            url,
            {"reset": {"seed": seed, "episode_id": "ep"}, "actions": [{"guess": g} for g in guesses]},
        )
    for answered in (idle, bad):
        assert (answered.reward, answered.done) == (0.0, False) and "action_error" in json.loads(
            answered.info_json
        )
    assert idle.messages[0].role == "user" and "call the tool `act`" in idle.messages[0].content
    assert (
        bad.messages[0].tool_call_id == "c0" and "arguments.guess must be integer" in bad.messages[0].content
    )
    same_as_own(ours, theirs["steps"])
    assert json.loads(seeded.messages[0].content) == theirs["reset"]["observation"]
    secret = secret_of(seed)
    assert guesses == [50, 25, 37, 31, 34] and secret == 34 and ours[-1].reward == 1.0
    assert [s.reward for s in ours[:-1]] == pytest.approx([-abs(g - secret) / 100 for g in guesses[:-1]])
    # each observation answers its call
    assert [s.messages[0].tool_call_id for s in ours] == [f"c{i + 1}" for i in range(len(ours))]


async def test_an_mcp_environments_tools_are_the_sessions_and_play_as_with_openenvs_own_client(
    tmp_path: Path, start_server: StartServer, openenv_python_each: Path
) -> None:
    """counter_mcp_env (seed 1: bring the counter to 9): its list_tools answer is the session's tools;
    add(4), count(), add(5) as tool calls step it as CallToolActions do through OpenEnv's client on
    the same server: the same observations, rewards and `done` (1.0 and over at exactly 9)."""
    row = {**EMPTY, "verifier_metadata": {"reset": {"seed": 1}}}
    plays = [("add", {"n": 4}), ("count", {}), ("add", {"n": 5})]
    async with serve(openenv_python_each, COUNTER_MCP_ENV, tmp_path / "counter.log") as url:
        async with verifier(tmp_path, start_server, {"counter": f'url = "{url}"\n'}) as (client, _):
            seeded = await client.verifier.seed_session("counter", row, session_id="ep")
            assert sorted(t.name for t in seeded.session_tools) == ["add", "count"]
            assert "exactly 9" in seeded.messages[0].content
            ours = [await client.verifier.step("ep", [call(f"c{i}", n, a)]) for i, (n, a) in enumerate(plays)]
            await client.verifier.close_session("ep")
        actions = [{"type": "call_tool", "tool_name": n, "arguments": a} for n, a in plays]
        theirs = await own_client(
            openenv_python_each, "play", url, {"reset": {"seed": 1}, "actions": actions}
        )
    same_as_own(ours, theirs["steps"])
    assert [s.messages[0].content for s in ours] == ["4", "4", "9"]  # each call answered with its result
    assert [(s.reward, s.done) for s in ours] == [(0.0, False), (0.0, False), (1.0, True)]


def binary_search(prompt_text: str, request: EngineRequest) -> str:
    """The fake model: guesses the middle of what guess_env's hints (the `act` calls' answers, each
    the observation as JSON) leave open, as a call to `act`."""
    del request
    low, high = 1, 100
    for answer in re.findall(r"<\|tool\|>\n(.*?)<\|end\|>", prompt_text, re.S):
        seen = json.loads(answer)
        if seen.get("hint") == "higher":
            low = seen["last_guess"] + 1
        elif seen.get("hint") == "lower":
            high = seen["last_guess"] - 1
    return f'<tool_call>{{"name": "act", "arguments": {{"guess": {(low + high) // 2}}}}}</tool_call>'


def expected_episode(seed: int) -> list[tuple[float, bool]]:
    """guess_env's (reward, done) per step for `binary_search` (6 attempts at most)."""
    secret, low, high, steps = secret_of(seed), 1, 100, []
    while not (steps and steps[-1][1]):
        guess = (low + high) // 2
        if guess == secret:
            steps.append((1.0, True))
        else:
            steps.append((-abs(guess - secret) / 100, len(steps) == 5))
            low, high = (guess + 1, high) if guess < secret else (low, guess - 1)
    return steps


async def test_a_job_plays_episodes_and_reverify_replays_them(
    tmp_path: Path, start_server: StartServer, openenv_python: Path
) -> None:
    seeds = [0, 1, 13, 5]  # won at the 1st, 4th, 5th guess; 5: not within 6 guesses
    rows = [{**EMPTY, "verifier_metadata": {"reset": {"seed": s}}} for s in seeds]
    data = tmp_path / "guess.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gateway = Gateway([FakeBackend("tiny", script=binary_search, max_model_len=8192)])
    await gateway.start()
    try:
        async with serve(openenv_python, GUESS_ENV, tmp_path / "guess.log") as url:
            async with verifier(tmp_path, start_server, {"guess": f'url = "{url}"\n'}) as (client, service):
                manager = JobManager(
                    Catalog([Root(BUILTIN_ROOT, 0, "root")]),
                    model=GatewayModel.in_process(GatewayServicer(gateway)),
                    env=VerifierEnv.in_process(VerifierServicer(service)),
                )
                spec = JobSpec(
                    dataset=str(data),
                    environment="guess",
                    max_steps=10,
                    sampling={"temperature": 0.0, "max_tokens": 64},
                    concurrency=4,
                    output_dir=str(tmp_path / "runs"),
                    retry=RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05),
                )
                rec = await manager.wait((await manager.submit(spec)).job_id)
                path = tmp_path / "runs" / rec.job_id / "rollouts.jsonl"
                done = sorted(store.load_files([path]).rollouts, key=lambda r: r.key.task_index)
                assert rec.state == "SUCCEEDED" and len(done) == len(seeds), rec
                stored = [r.to_row() for r in done]
                report = await reverify(stored, environment="guess", verifier=client.addresses["verifier"])
                assert len(service.sessions) == 0  # every episode, live or replayed, was closed
    finally:
        await gateway.shutdown()
    for seed, rollout, row in zip(seeds, done, stored, strict=True):
        steps = expected_episode(seed)
        assert [s["done"] for s in rollout.env_steps] == [d for _, d in steps]
        assert [s["reward"] for s in rollout.env_steps] == pytest.approx([r for r, _ in steps])
        assert rollout.reward == pytest.approx(sum(r for r, _ in steps))
        calls = [m for m in rollout.messages if m["role"] == "assistant"]
        answers = [m for m in rollout.messages if m["role"] == "tool"]
        assert len(calls) == len(answers) == len(steps)  # each guess a call to act, each answered
        assert [json.loads(a["content"]) for a in answers] == [
            s["info"]["observation"] for s in rollout.env_steps
        ]
        assert row["reward"] == rollout.reward
    assert (report.scored, report.errors, report.changed, report.diverged) == (len(seeds), 0, 0, 0)
    for old, new in zip(stored, report.rows, strict=True):
        assert (new["reward"], new["env_steps"]) == (old["reward"], old["env_steps"])


async def test_failures_are_named_never_a_reward(
    tmp_path: Path, start_server: StartServer, openenv_python: Path
) -> None:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: refused
        async with contextlib.AsyncExitStack() as server:
            url = await server.enter_async_context(serve(openenv_python, GUESS_ENV, tmp_path / "guess.log"))
            tomls = {
                "gone": f'url = "{nobody}"\ntimeout_s = 5\n',
                "as_text": f'url = "{url}"\naction = "text"\n',
                "guess": f'url = "{url}"\n',
                "wrong_field": f'url = "{url}"\nobservation_field = "attempts_left"\n',
            }
            async with verifier(tmp_path, start_server, tomls) as (client, _):
                listed = {b.name: b.error for b in (await client.verifier.list()).broken}
                assert set(listed) == {"gone", "as_text"}
                assert "ClientConnectorError" in listed["gone"]
                assert "the model's text cannot make an action" in listed["as_text"]
                for name, reason in (("gone", "ENV_SERVER_UNREACHABLE"), ("as_text", "ACTION_NOT_BUILDABLE")):
                    with pytest.raises(RollmeshClientError) as err:
                        await client.verifier.seed_session(name, EMPTY)
                    assert err.value.reason == reason, err.value
                with pytest.raises(RollmeshClientError) as err:
                    await client.verifier.seed_session("wrong_field", EMPTY)
                assert err.value.reason == "ENV_SERVER_BAD_REPLY", err.value
                assert "`attempts_left` is int" in str(err.value)
                await client.verifier.seed_session("guess", EMPTY, session_id="raises")
                with pytest.raises(RollmeshClientError) as err:  # the environment's step raised
                    await client.verifier.step("raises", [call("c", "act", {"guess": 0})])
                assert err.value.reason == "ENV_SERVER_ERROR", err.value
                assert "guess 0 is outside 1..100" in str(err.value)
                await client.verifier.seed_session("guess", EMPTY, session_id="orphan")
                await server.aclose()  # the server is gone under the open episode
                with pytest.raises(RollmeshClientError) as err:
                    await client.verifier.step("orphan", [call("c", "act", {"guess": 5})])
                assert err.value.reason == "ENV_SERVER_UNREACHABLE", err.value


async def test_a_managed_server_that_dies_is_restarted_and_its_episodes_are_lost_by_name(
    tmp_path: Path, start_server: StartServer, openenv_python: Path
) -> None:
    """The verifier's sidecar running guess_env is killed under an open episode: the episode's next
    step fails by name (the socket dropped, or the server restarted under it), the sidecar comes back
    on its address, a new episode plays, and the old one stays lost (ENV_SESSION_LOST), never scored."""
    toml = f'env_dir = "{GUESS_ENV}"\npython = "{openenv_python}"\n'
    guess = [call("c", "act", {"guess": 50})]
    async with verifier(tmp_path, start_server, {"guess": toml}) as (client, service):
        sidecar = bridge(service, "guess").sidecar
        assert sidecar is not None and sidecar.pid is not None
        address = sidecar.address
        await client.verifier.seed_session("guess", EMPTY, session_id="old")
        os.kill(sidecar.pid, signal.SIGKILL)
        # Until the supervisor has seen the death, the confined server (the killed wrapper's child,
        # ended by its parent-death signal) may still answer a step: that answer is the old server's own.
        async with asyncio.timeout(60):
            while sidecar.incarnation == 0:  # noqa: ASYNC110 (the supervisor task counts it)
                await asyncio.sleep(0.01)
        with pytest.raises(RollmeshClientError) as err:
            await client.verifier.step("old", guess)
        assert err.value.reason in ("ENV_SERVER_UNREACHABLE", "ENV_SESSION_LOST"), err.value
        assert await sidecar.ready(120.0) and sidecar.restarts == 1 and sidecar.address == address
        await client.verifier.seed_session("guess", EMPTY, session_id="new")
        assert (
            json.loads((await client.verifier.step("new", guess)).info_json)["observation"]["last_guess"]
            == 50
        )
        with pytest.raises(RollmeshClientError) as err:
            await client.verifier.step("old", guess)
        assert err.value.reason == "ENV_SESSION_LOST", err.value


def malformed_server(step_answer: str, *, websocket: bool = True) -> web.Application:
    """A server speaking OpenEnv's protocol whose step answers `step_answer` (what a real one cannot
    send: its pydantic models answer well-formed observations); without `websocket`, no /ws."""

    async def schema(request: web.Request) -> web.Response:
        action = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
        return web.json_response({"action": action, "observation": {}, "state": {}})

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            kind = json.loads(msg.data)["type"]
            if kind == "close":
                break
            if kind == "reset":
                await sock.send_str(
                    json.dumps({"type": "observation", "data": {"observation": {}, "done": False}})
                )
            else:
                await sock.send_str(step_answer)
        return sock

    app = web.Application()
    app.router.add_get("/schema", schema)
    if websocket:
        app.router.add_get("/ws", ws)
    return app


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (
            '{"type": "observation", "data": {"observation": {}, "reward": "lots", "done": false}}',
            "reward = 'lots'",
        ),
        ('{"type": "observation", "data": {"observation": [1], "done": false}}', "no observation object"),
        ('{"type": "observation", "data": {"observation": {}, "done": 1}}', "done = 1"),
        ("not json", "not JSON"),
        ('{"type": "surprise"}', "a message of type 'surprise'"),
    ],
)
async def test_an_answer_that_is_not_an_observation_is_a_bad_reply(
    tmp_path: Path, start_server: StartServer, answer: str, says: str
) -> None:
    async with serve_app(malformed_server(answer)) as url:
        async with verifier(tmp_path, start_server, {"odd": f'url = "{url}"\n'}) as (client, _):
            await client.verifier.seed_session("odd", EMPTY, session_id="ep")
            with pytest.raises(RollmeshClientError) as err:
                await client.verifier.step("ep", "hello")
    assert err.value.reason == "ENV_SERVER_BAD_REPLY" and says in str(err.value)


async def test_a_server_without_the_websocket_session_is_named_at_seed(
    tmp_path: Path, start_server: StartServer
) -> None:
    """A server with /schema but no /ws (its HTTP /reset and /step build a fresh environment per call:
    no episode can be held) fails the seed by name, never falls back to them."""
    async with serve_app(malformed_server("", websocket=False)) as url:
        async with verifier(tmp_path, start_server, {"http_only": f'url = "{url}"\n'}) as (client, _):
            with pytest.raises(RollmeshClientError) as err:
                await client.verifier.seed_session("http_only", EMPTY)
    assert err.value.reason == "ENV_SERVER_UNREACHABLE" and "WSServerHandshakeError" in str(err.value)


async def test_a_server_at_its_session_limit_is_named_and_max_sessions_keeps_within_it(
    tmp_path: Path, start_server: StartServer, openenv_python: Path
) -> None:
    """The template serves one WebSocket session at a time (`max_concurrent_envs=1`): a second episode
    is refused by the server, named; with `max_sessions = 1` the second waits for the first to close."""
    env_dir = init_template(openenv_python, tmp_path / "envs")
    async with serve(openenv_python, env_dir, tmp_path / "echo.log") as url:
        tomls = {"unbounded": f'url = "{url}"\n', "bounded": f'url = "{url}"\nmax_sessions = 1\n'}
        async with verifier(tmp_path, start_server, tomls) as (client, service):
            await client.verifier.seed_session("unbounded", EMPTY, session_id="first")
            with pytest.raises(RollmeshClientError) as err:
                await client.verifier.seed_session("unbounded", EMPTY, session_id="second")
            assert err.value.reason == "ENV_SERVER_AT_CAPACITY" and "max_sessions" in str(err.value)
            await client.verifier.close_session("first")

            await client.verifier.seed_session("bounded", EMPTY, session_id="a")
            second = asyncio.create_task(client.verifier.seed_session("bounded", EMPTY, session_id="b"))
            bounded = bridge(service, "bounded")
            while bounded.waiting == 0:  # the second seed waits for the first episode's slot
                assert not second.done(), second
                await asyncio.sleep(0.01)
            assert (await client.verifier.step("a", "one")).reward == pytest.approx(0.3)
            await client.verifier.close_session("a")
            assert (await second).takes_turns
            assert (await client.verifier.step("b", "two!")).reward == pytest.approx(0.4)
            await client.verifier.close_session("b")
