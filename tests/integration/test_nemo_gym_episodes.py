"""Rows whose prompt the server gives: NeMo Gym's aviary and toolsandbox rows carry an empty `input`
(`{"task_idx": 0, "responses_create_params": {"input": []}}`) and their servers answer /seed_session
with the first observation and the session's tools, then take the episode a /step per assistant
turn, keyed by `env_id`. Run here as jobs (the scheduler's job manager, the real gateway with the
fake model, the real verifier) against a server speaking that protocol on loopback
(tests/nemo_gym_fake.py EpisodeGym): aviary needs GSM8K/HotpotQA from the Hugging Face hub and
toolsandbox a user-simulator model server resolved through ng_run's head server, so neither real
server runs offline here. Where nothing can give a row's prompt, the rollout or the job is refused
naming it (NO_PROMPT), never sent to the model empty."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.errors import RollmeshError
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.registry import RootsConfig
from rollmesh.scheduler import store
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.records import Rollout
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.spec import JobSpec
from rollmesh.scheduler.spec import RetryPolicy
from rollmesh.verifier import Response
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
from rollmesh.verifier.servicer import VerifierServicer
from tests.http_apps import serve_app
from tests.nemo_gym_fake import EpisodeGym
from tests.nemo_gym_fake import FakeGym
from tests.nemo_gym_fake import fake_gym

ROWS = [{"task_idx": i, "responses_create_params": {"input": []}} for i in range(3)]


def plays(prompt_text: str, request: EngineRequest) -> str:
    """The fake model: asks `add` for the sum in the last user message, then submits the tool's answer."""
    del request
    outputs = re.findall(r"<\|tool\|>\n(.*?)<\|end\|>", prompt_text, re.S)
    if outputs:
        return (
            f'<tool_call>{{"name": "submit_answer", "arguments": {{"answer": "{outputs[-1]}"}}}}</tool_call>'
        )
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt_text)[-1]
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


async def run_job(
    tmp_path: Path, urls: dict[str, str], environment: str, rows: list[dict[str, Any]] = ROWS
) -> tuple[Any, list[Rollout], VerifierService]:
    for name, url in urls.items():
        folder = tmp_path / "root" / "environments" / name
        folder.mkdir(parents=True)
        (folder / "nemo_gym.toml").write_text(f'server = "{name}"\nurl = "{url}"\n')
    (tmp_path / "root" / "environments").mkdir(parents=True, exist_ok=True)
    roots = RootsConfig(Path("/nonexistent"), (tmp_path / "root",), BUILTIN_ROOT, False)
    service = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await service.start()
    gateway = Gateway([FakeBackend("tiny", script=plays, max_model_len=8192)])
    await gateway.start()
    try:
        data = tmp_path / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        manager = JobManager(
            Catalog([Root(BUILTIN_ROOT, 0, "root")]),
            model=GatewayModel.in_process(GatewayServicer(gateway)),
            env=VerifierEnv.in_process(VerifierServicer(service)),
        )
        spec = JobSpec(
            dataset=str(data),
            environment=environment,
            max_steps=6,
            sampling={"temperature": 0.0, "max_tokens": 256},
            concurrency=3,
            output_dir=str(tmp_path / "runs"),
            retry=RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2),
        )
        rec = await manager.wait((await manager.submit(spec)).job_id)
        path = tmp_path / "runs" / rec.job_id / "rollouts.jsonl"
        rows = store.load_files([path]).rollouts if path.exists() else []
        return rec, sorted(rows, key=lambda r: r.key.task_index), service
    finally:
        await gateway.shutdown()
        await service.aclose()


async def test_rows_with_an_empty_input_run_on_the_servers_first_observation(tmp_path: Path) -> None:
    gym = EpisodeGym()
    async with serve_app(gym.app()) as url:
        rec, rollouts, _ = await run_job(tmp_path, {"episodes": url}, "episodes")
    assert rec.state == "SUCCEEDED" and len(rollouts) == 3, rec
    for r in rollouts:
        i = r.key.task_index
        msgs = r.messages
        # the episode starts with the server's observation (prompt, not the policy's)
        assert [m["role"] for m in msgs[:2]] == ["system", "user"]
        assert msgs[1]["content"] == f"What is {i} + {i + 2}?"
        # add answered by the server's step, then submit_answer ended the episode on `done`
        assert [m["role"] for m in msgs[2:]] == ["assistant", "tool", "assistant", "tool"]
        assert msgs[3]["content"] == str(2 * i + 2) and r.reward == 1.0
        # the server's reward came from /verify after /close; the step's own is recorded, not re-added
        assert [s["info"] for s in r.env_steps] == [{"step_reward": 0.0}, {"step_reward": 1.0}]
        assert [s["reward"] for s in r.env_steps] == [0.0, 0.0]
    per_episode = [c for c in gym.calls if c != "seed_session"]
    assert per_episode.count("close") == 3 and per_episode.count("verify") == 3
    for env in gym.episodes.values():
        assert env["closed"] and env["scored"] == 1.0


async def test_a_stored_episode_is_replayed_by_a_session_less_verify(tmp_path: Path) -> None:
    gym = EpisodeGym()
    async with serve_app(gym.app()) as url:
        folder = tmp_path / "environments" / "episodes"
        folder.mkdir(parents=True)
        (folder / "nemo_gym.toml").write_text(f'server = "episodes"\nurl = "{url}"\n')
        roots = RootsConfig(Path("/nonexistent"), (tmp_path,), BUILTIN_ROOT, False)
        svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
        await svc.start()
        try:
            row = json.dumps(ROWS[1])
            add = ToolCall("c1", "add", '{"a": 1, "b": 3}')

            def episode(answer: str) -> Response:
                submit = ToolCall("c2", "submit_answer", json.dumps({"answer": answer}))
                return Response(
                    (
                        Message("assistant", "", (add,)),
                        Message("tool", "4", tool_call_id="c1"),
                        Message("assistant", "", (submit,)),
                    )
                )

            right = await svc.verify(VerifyCall("episodes", row, episode("4")))
            wrong = await svc.verify(VerifyCall("episodes", row, episode("5")))
        finally:
            await svc.aclose()
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert gym.calls == ["seed_session", "step", "step", "close", "verify"] * 2


async def test_an_empty_input_nothing_answers_is_refused_naming_it(tmp_path: Path) -> None:
    # a server that seeds a session but gives no observation: each rollout fails NO_PROMPT
    rows = [r | {"initial_count": 0, "expected_count": 0} for r in ROWS]
    async with fake_gym(FakeGym()) as url:
        rec, rollouts, _ = await run_job(tmp_path, {"counter": url}, "counter", rows)
    failures = rec.run.failures if rec.run is not None else []
    assert not rollouts and len(failures) == 3, (rec.state, failures)
    assert all(f.error_class == "NO_PROMPT" and f.attempts == 1 for f in failures), failures
    # a stateless environment opens no session for such a row: the job is refused at submit
    with pytest.raises(RollmeshError) as info:
        await run_job(tmp_path / "b", {}, "arithmetic")
    assert info.value.reason == "NO_PROMPT" and "row 0" in info.value.message
