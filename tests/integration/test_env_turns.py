"""Environment turns end to end: a turn-taking environment (tests/games.py's number-guessing game) in
the real verifier, the real gateway with the fake model playing it (a binary search over the hints),
and the scheduler's job manager, over gRPC and over the embedded mesh's in-process ports. Every
episode ends on the environment's `done`; the rows hold each step's reward and `done`, a reward equal
to the steps' rewards plus verify's, the messages in the order the model saw them (the opening from
seeding, then each guess and its hint), and a token record that trains on the guesses only (the
environment's messages are prompt, loss mask 0, and each turn's prompt extends the ids before it)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.commands._reverify import reverify
from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.scheduler import store
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.records import TokenRecord
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.scheduler.tokens import validate_rollout
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.errors import CheckFailed
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh.verifier.workers import WorkerPool
from rollmesh_client import Client
from tests.conftest import StartServer
from tests.games import RIGHT
from tests.games import WON_BONUS
from tests.games import WRONG
from tests.games import Guess
from tests.games import guess_row
from tests.games import guesses_to_find
from tests.games import play_guess
from tests.games import score

SECRETS = (50, 37, 88, 1, 100)


@dataclass
class Mesh:
    """The gateway and verifier servicers, and their addresses (one gRPC server each)."""

    gateway: GatewayServicer
    verifier: VerifierServicer
    service: VerifierService
    gateway_addr: str
    verifier_addr: str


@pytest_asyncio.fixture
async def mesh(start_server: StartServer) -> AsyncIterator[Mesh]:
    gateway = Gateway([FakeBackend("tiny", script=_plays, max_model_len=4096)])
    await gateway.start()
    cfg = VerifierConfig()
    envs = {
        "guess": Guess(EnvContext("guess", None, cfg, WorkerPool(1))),
        "calls": CallsAreTheAnswer(EnvContext("calls", None, cfg, WorkerPool(1))),
    }
    verifier = VerifierService(cfg, Discovery({n: Loaded(n, e, "tests") for n, e in envs.items()}, {}))
    await verifier.start()
    gw, ver = GatewayServicer(gateway), VerifierServicer(verifier)
    gw_server = await start_server([ServiceBinding.of(gw)])
    ver_server = await start_server([ServiceBinding.of(ver)])
    try:
        yield Mesh(gw, ver, verifier, gw_server.address, ver_server.address)
    finally:
        await verifier.aclose()
        await gateway.shutdown()


class CallsAreTheAnswer(Environment):
    """The model's tool call is its answer (NeMo Gym's non_executing_simple_agent, xlam_fc): 1.0 when
    it called get_weather for the row's city, and nothing ran it."""

    def tool_calls_are_answer(self) -> bool:
        return True

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        calls = [(c.name, json.loads(c.arguments_json)) for c in response.tool_calls]
        unanswered = all(response.tool_output(c.id) is None for c in response.tool_calls)
        ok = calls == [("get_weather", {"city": task.expected_answer})] and unanswered
        return VerifyResult(reward=1.0 if ok else 0.0)


WEATHER = {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _plays(prompt_text: str, request: EngineRequest) -> str:
    """The guessing game (play_guess), or a get_weather call when asked about the weather."""
    found = re.search(r"weather in (\w+)", prompt_text)
    if found:
        return (
            f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "{found.group(1)}"}}}}</tool_call>'
        )
    return play_guess(prompt_text, request)


class StepFailsOnce(VerifierEnv):
    """The in-process verifier port, whose step fails once (retryably) in the third turn of `key`'s
    first attempt: the attempt is retried from a new session."""

    def __init__(self, servicer: VerifierServicer, key: str) -> None:
        port = VerifierEnv.in_process(servicer)
        super().__init__(port.stub, port._many)
        self.key, self.steps, self.failed = key, 0, False

    async def step(self, session_id: str, messages: list[dict[str, Any]]) -> Any:
        if session_id.endswith(self.key) and not self.failed:
            self.steps += 1
            if self.steps == 3:
                self.failed = True
                raise CheckFailed("injected: the step's checker broke")
        return await super().step(session_id, messages)


async def _run_job(
    mesh: Mesh,
    kind: str,
    tmp_path: Path,
    *,
    max_steps: int,
    environment: str = "guess",
    rows: list[dict[str, Any]] | None = None,
    env_port: VerifierEnv | None = None,
) -> list[Rollout]:
    """Run a job (the guessing game's rows by default) through the scheduler's job manager on `kind`
    ports (or `env_port` for the verifier's); its rows, by key."""
    if kind == "grpc":
        model, env = GatewayModel.connect(mesh.gateway_addr), VerifierEnv.connect(mesh.verifier_addr)
    else:
        model, env = GatewayModel.in_process(mesh.gateway), VerifierEnv.in_process(mesh.verifier)
    env = env_port or env
    rows = rows if rows is not None else [guess_row(s) for s in SECRETS]
    data = tmp_path / f"{environment}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manager = JobManager(Catalog([Root(BUILTIN_ROOT, 0, "root")]), model=model, env=env)
    spec = JobSpec(
        dataset=str(data),
        environment=environment,
        max_steps=max_steps,
        sampling={"temperature": 0.0, "max_tokens": 64, "logprobs": True},
        concurrency=3,
        output_dir=str(tmp_path / kind),
        validate_all=True,
        retry=RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05),
    )
    try:
        rec = await manager.wait((await manager.submit(spec)).job_id)
        assert rec.state == "SUCCEEDED", rec.to_json()
        lines = (rec.directory / store.ROLLOUTS).read_text().splitlines()
    finally:
        await manager.aclose()
        await model.close()
        await env.close()
    out = sorted((Rollout.from_row(json.loads(line)) for line in lines), key=lambda r: r.key)
    assert [r.key.task_index for r in out] == list(range(len(rows)))
    return out


def _texts(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


@pytest.mark.parametrize("kind", ["grpc", "in_process"])
async def test_episodes_end_on_done_with_step_rewards_and_exact_tokens(
    mesh: Mesh, kind: str, tmp_path: Path
) -> None:
    rows = await _run_job(mesh, kind, tmp_path, max_steps=10)
    for secret, row in zip(SECRETS, rows, strict=True):
        guesses = guesses_to_find(secret)
        expected = [("user", "I picked a number between 1 and 100. Guess it.")]
        for g in guesses[:-1]:
            expected += [("assistant", str(g)), ("user", f"{g} is too {'low' if g < secret else 'high'}")]
        expected.append(("assistant", str(secret)))
        assert _texts(row.messages) == expected, secret
        assert row.env_steps == [
            *({"reward": WRONG, "done": False, "info": {}} for _ in guesses[:-1]),
            {"reward": RIGHT, "done": True, "info": {"guesses": len(guesses)}},
        ]
        assert row.reward == score(secret) and row.reward_components == {"won": 1.0}
        assert row.reward == sum(s["reward"] for s in row.env_steps) + WON_BONUS
        assert row.finish_reason == "stop"
        # The token record: one span per guess, trained on the guesses only; the hints and the
        # opening are prompt (loss mask 0) and decode inside the spans' prompts, in order.
        assert validate_rollout(row, tokenizer=FakeTokenizer()) == []
        tokens: TokenRecord = row.tokens
        assert len(tokens.turns) == len(guesses)
        tok = FakeTokenizer()
        for i, span in enumerate(tokens.turns):
            prompt_part = tok.decode(tokens.token_ids[span.prompt_start : span.output_start])
            assert not any(tokens.loss_mask[span.prompt_start : span.output_start])
            assert all(tokens.loss_mask[span.output_start : span.output_end])
            told = expected[2 * i][1]  # the opening, then each hint
            assert f"<|user|>\n{told}<|end|>" in prompt_part, (i, prompt_part)


async def test_the_same_rows_over_grpc_and_in_process(mesh: Mesh, tmp_path: Path) -> None:
    def view(r: Rollout) -> tuple[Any, ...]:
        return (r.key, r.messages, r.reward, r.env_steps, r.tokens.token_ids, r.tokens.loss_mask)

    over_grpc = [view(r) for r in await _run_job(mesh, "grpc", tmp_path, max_steps=10)]
    in_process = [view(r) for r in await _run_job(mesh, "in_process", tmp_path, max_steps=10)]
    assert over_grpc == in_process


async def test_an_episode_not_done_at_max_steps_ends_there(mesh: Mesh, tmp_path: Path) -> None:
    rows = await _run_job(mesh, "grpc", tmp_path, max_steps=2)
    for secret, row in zip(SECRETS, rows, strict=True):
        if secret == 50:  # the first guess: done at once
            assert [s["done"] for s in row.env_steps] == [True] and row.finish_reason == "stop"
            continue
        assert row.finish_reason == "max_steps" and [s["done"] for s in row.env_steps] == [False, False]
        assert row.reward == 2 * WRONG and row.reward_components == {"won": 0.0}
        assert [m["role"] for m in row.messages] == ["user", "assistant", "user", "assistant", "user"]


async def test_the_sdk_drives_an_episode_over_the_verifiers_grpc_api(mesh: Mesh) -> None:
    async with await Client.connect(verifier=mesh.verifier_addr) as c:
        described = await c.verifier.get("guess")
        assert described.takes_turns and not described.stateless
        seeded = await c.verifier.seed_session("guess", guess_row(37), session_id="ep-1")
        assert [t.name for t in seeded.session_tools] == ["peek"] and [t.name for t in seeded.tools] == [
            "hint"
        ]
        assert seeded.takes_turns and [(m.role, m.content) for m in seeded.messages] == [
            ("user", "I picked a number between 1 and 100. Guess it.")
        ]
        high = await c.verifier.step("ep-1", "50")
        assert [(m.role, m.content) for m in high.messages] == [("user", "50 is too high")]
        assert (high.reward, high.done, high.info_json) == (WRONG, False, "")
        won = await c.verifier.step("ep-1", "37")
        assert (list(won.messages), won.reward, won.done, json.loads(won.info_json)) == (
            [],
            RIGHT,
            True,
            {"guesses": 2},
        )
        verdict = await c.verifier.verify("guess", guess_row(37), "37", session_id="ep-1")
        assert verdict.reward == WON_BONUS
        await c.verifier.close_session("ep-1")


async def test_reverify_replays_each_episode_in_a_new_session(mesh: Mesh, tmp_path: Path) -> None:
    """A turn-taking environment's rows are re-scored by playing their recorded turns again (the
    steps need the episode): the same rewards and steps; a row whose last guess is edited scores
    what the edited episode earns; a row with no assistant turn is a per-row error."""
    rows = [r.to_row() for r in await _run_job(mesh, "grpc", tmp_path, max_steps=10)]
    report = await reverify(rows, environment="guess", verifier=mesh.verifier_addr, window=2)
    assert (report.scored, report.errors, report.changed) == (len(SECRETS), 0, 0)
    for old, new in zip(rows, report.rows, strict=True):
        assert (new["reward"], new["env_steps"]) == (old["reward"], old["env_steps"])
        assert new["previous_reward"] == old["reward"]

    edited = json.loads(json.dumps(rows[1]))  # secret 37: 50, 25, 37
    edited["chat_messages"][-1]["content"] = "36"
    empty = json.loads(json.dumps(rows[2]))
    empty["chat_messages"] = []
    again = await reverify([edited, empty], environment="guess", verifier=mesh.verifier_addr)
    assert (again.scored, again.errors, again.changed) == (1, 1, 1)
    assert (
        again.rows[0]["reward"] == 3 * WRONG
        and [s["done"] for s in again.rows[0]["env_steps"]] == [False] * 3
    )
    # scored, and flagged: the episode was over live, and its replay ran out of turns before it was
    assert again.diverged == 1 and again.failed
    assert again.rows[0]["reverify_warning"].startswith("REPLAY_DIVERGED: the recorded episode ended (done)")
    assert "reverify_warning" not in report.rows[1]
    longer = json.loads(json.dumps(rows[1]))  # a turn recorded after the winning guess
    longer["chat_messages"].append({"role": "assistant", "content": "40"})
    third = await reverify([longer], environment="guess", verifier=mesh.verifier_addr)
    assert third.rows[0]["reverify_warning"] == (
        "REPLAY_DIVERGED: the replayed episode ended (done) after 3 of its 4 recorded turns"
    )
    assert again.rows[1]["reverify_error"].startswith("NOTHING_TO_REPLAY: the rollout has no assistant turn")
    assert again.rows[1]["reward"] == rows[2]["reward"]  # the row keeps its reward
    assert len(mesh.service.sessions) == 0  # every replayed session was closed


async def test_when_tool_calls_are_the_answer_the_first_call_ends_the_rollout_unexecuted(
    mesh: Mesh, tmp_path: Path
) -> None:
    described = await VerifierEnv.in_process(mesh.verifier).describe_environment("calls")
    assert described.tool_calls_are_answer
    rows = [
        {
            "responses_create_params": {"input": f"What is the weather in {city}?", "tools": [WEATHER]},
            "expected_answer": city,
        }
        for city in ("Paris", "Lima")
    ]
    for row in await _run_job(mesh, "grpc", tmp_path, max_steps=4, environment="calls", rows=rows):
        assert row.reward == 1.0 and row.finish_reason == "tool_calls" and len(row.tokens.turns) == 1
        assert [m["role"] for m in row.messages] == ["assistant"]
    assert len(mesh.service.sessions) == 0


async def test_an_episode_retried_after_a_failed_step_is_played_again_from_a_new_session(
    mesh: Mesh, tmp_path: Path
) -> None:
    """Retries are those of any rollout: the attempt whose step failed is dropped whole, the next
    one seeds a new session and plays the episode from the start; each key is written once."""
    port = StepFailsOnce(mesh.verifier, "/1/0")  # secret 37: three guesses, the third step fails once
    rows = await _run_job(mesh, "in_process", tmp_path, max_steps=10, env_port=port)
    assert port.failed and [r.attempts for r in rows] == [1, 2, 1, 1, 1]
    retried = rows[1]
    assert retried.reward == score(37) and len(retried.env_steps) == len(guesses_to_find(37))
    assert [m["role"] for m in retried.messages].count("assistant") == len(guesses_to_find(37))
    assert validate_rollout(retried, tokenizer=FakeTokenizer()) == []
    assert len(mesh.service.sessions) == 0
