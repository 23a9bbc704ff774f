"""Jobs through the bridge: NeMo Gym's own example rows run end to end by the scheduler's job manager
against real NeMo Gym servers the verifier manages (the NeMo Gym 0.4.0 virtualenv), the fake model
playing them through the real gateway: tool calls reach the server with the session's cookie, a
gymnasium episode ends on the server's `done`. A managed server SIGKILLed mid-job is restarted and
the job still ends with every key exactly once; a server that cannot start fails the job's start in
one line naming the interpreter, the server and its log."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.devtools.fake_scripts import nemo_gym_counter_agent
from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
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
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.nemo_gym import NemoGymEnvironment
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys

COUNTER = "ng_example_session_state_mgmt"
MULTI_TURN = "ng_example_multi_turn_gymnasium"
XLAM = "ng_xlam_fc"
#: What the fake model answers an xlam_fc row with, by a prefix of its user message (set per test).
XLAM_ANSWERS: dict[str, list[dict[str, Any]]] = {}


def plays(prompt_text: str, request: EngineRequest) -> str:
    """The fake model: on a counter row ("add 1 then add 2 then get the count") it calls
    increment_counter once per number, then get_counter_value, then says the count; on a multi-turn
    row it answers each user message with its last word and then `Eiffel`."""
    user = re.search(r"<\|user\|>\n(.*?)<\|end\|>", prompt_text, re.S)
    asked = user.group(1) if user else ""
    for prefix, calls in XLAM_ANSWERS.items():
        if asked.startswith(prefix):
            return "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in calls)
    if "then get the count" in asked:
        return nemo_gym_counter_agent(prompt_text, request)
    return f"The Eiffel tower; {prompt_text.rsplit(' ', 1)[-1][:20]}"


@dataclass
class Mesh:
    service: VerifierService
    gateway: GatewayServicer
    verifier: VerifierServicer
    backend: FakeBackend


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory, nemo_gym_python: Path) -> AsyncIterator[Mesh]:
    root = tmp_path_factory.mktemp("jobs-root")
    servers = (
        (COUNTER, "example_session_state_mgmt", ""),
        (MULTI_TURN, "example_multi_turn_gymnasium", ""),
        (XLAM, "xlam_fc", "tool_calls_are_answer = true\n"),
    )
    for name, server, extra in servers:
        folder = root / "environments" / name
        folder.mkdir(parents=True)
        (folder / "nemo_gym.toml").write_text(f'server = "{server}"\npython = "{nemo_gym_python}"\n{extra}')
    roots = RootsConfig(Path("/nonexistent"), (root,), BUILTIN_ROOT, False)
    service = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await service.start()
    backend = FakeBackend("tiny", script=plays, max_model_len=8192)
    gateway = Gateway([backend])
    await gateway.start()
    try:
        yield Mesh(service, GatewayServicer(gateway), VerifierServicer(service), backend)
    finally:
        await service.aclose()
        await gateway.shutdown()


async def run_job(
    mesh: Mesh, rows: list[dict[str, Any]], environment: str, out: Path, repeats: int = 1
) -> tuple[Any, list[Rollout]]:
    data = out / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manager = JobManager(
        Catalog([Root(BUILTIN_ROOT, 0, "root")]),
        model=GatewayModel.in_process(mesh.gateway),
        env=VerifierEnv.in_process(mesh.verifier),
    )
    spec = JobSpec(
        dataset=str(data),
        environment=environment,
        num_repeats=repeats,
        max_steps=8,
        sampling={"temperature": 0.0, "max_tokens": 1024},
        concurrency=4,
        output_dir=str(out),
        retry=RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2),
    )
    rec = await manager.wait((await manager.submit(spec)).job_id)
    rows_out = store.load_files([out / rec.job_id / "rollouts.jsonl"]).rollouts
    return rec, sorted(rows_out, key=lambda r: (r.key.task_index, r.key.rollout_index))


def example_rows(servers: Path, server: str) -> list[dict[str, Any]]:
    path = servers / server / "data" / "example.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@pytest.mark.asyncio(loop_scope="module")
async def test_nemo_gyms_session_rows_run_end_to_end(
    mesh: Mesh, nemo_gym_servers: Path, tmp_path: Path
) -> None:
    rows = example_rows(nemo_gym_servers, "example_session_state_mgmt")
    rec, out = await run_job(mesh, rows, COUNTER, tmp_path)
    assert rec.state == "SUCCEEDED" and len(out) == len(rows)
    for row, rollout in zip(rows, out, strict=True):
        calls = [c["function"]["name"] for m in rollout.messages for c in m.get("tool_calls") or []]
        assert calls == ["increment_counter", "increment_counter", "get_counter_value"]
        # the count the server reports is initial + increments: the cookie kept the session
        assert f"The count is {row['expected_count']}." == rollout.messages[-1]["content"]
        assert rollout.reward == 1.0


@pytest.mark.asyncio(loop_scope="module")
async def test_a_gymnasium_episode_ends_on_the_servers_done(
    mesh: Mesh, nemo_gym_servers: Path, tmp_path: Path
) -> None:
    rows = example_rows(nemo_gym_servers, "example_multi_turn_gymnasium")
    rec, out = await run_job(mesh, rows, MULTI_TURN, tmp_path)
    assert rec.state == "SUCCEEDED" and len(out) == len(rows)
    for row, rollout in zip(rows, out, strict=True):
        users = [m["content"] for m in rollout.messages if m["role"] == "user"]
        assert users == row["follow_ups"]  # each follow-up came from /step, then the episode ended
        assert len(rollout.env_steps) == len(row["follow_ups"]) + 1 and rollout.env_steps[-1]["done"]
        want = 1.0 if row["expected_answer"].lower() in rollout.messages[-1]["content"].lower() else 0.0
        assert rollout.reward == want


@pytest.mark.asyncio(loop_scope="module")
async def test_tool_calls_that_are_the_answer_are_verified_not_run(
    mesh: Mesh, nemo_gym_servers: Path, tmp_path: Path
) -> None:
    rows = example_rows(nemo_gym_servers, "xlam_fc")
    for i, row in enumerate(rows):  # the right calls for even rows, none of them for odd ones
        params = row["responses_create_params"]
        user = next(m["content"] for m in reversed(params["input"]) if m["role"] == "user")
        right = row["expected_answers"]
        XLAM_ANSWERS[user[:60]] = right if i % 2 == 0 else [{"name": "nothing", "arguments": {}}]
    try:
        rec, out = await run_job(mesh, rows, XLAM, tmp_path)
    finally:
        XLAM_ANSWERS.clear()
    assert rec.state == "SUCCEEDED" and len(out) == len(rows)
    for i, rollout in enumerate(out):
        assert [m["role"] for m in rollout.messages] == ["assistant"]  # one turn; no call was run
        assert rollout.finish_reason == "tool_calls"
        assert rollout.reward == (1.0 if i % 2 == 0 else 0.0), (i, rollout.verify_details)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_managed_server_killed_mid_job_is_restarted_and_the_job_completes_once(
    mesh: Mesh, nemo_gym_servers: Path, tmp_path: Path
) -> None:
    env = mesh.service.environment(COUNTER)
    assert isinstance(env, NemoGymEnvironment) and env.sidecar is not None
    sidecar = env.sidecar
    first_pid = sidecar.pid
    rows = example_rows(nemo_gym_servers, "example_session_state_mgmt")
    kill_at = 6
    calls = 0

    def killing(prompt_text: str, request: EngineRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == kill_at and sidecar.pid is not None:
            os.kill(sidecar.pid, signal.SIGKILL)
        return plays(prompt_text, request)

    mesh.backend.script = killing  # runs per model call: the 6th kills the server mid-episode
    try:
        rec, out = await run_job(mesh, rows, COUNTER, tmp_path, repeats=4)
    finally:
        mesh.backend.script = plays
    assert sidecar.restarts >= 1 and sidecar.pid != first_pid
    check_exactly_once(tmp_path / rec.job_id, expected_keys(len(rows), 4), complete=True)
    assert rec.state == "SUCCEEDED" and len(out) == 20 and all(r.reward == 1.0 for r in out)
    _, broken = mesh.service.list_environments()
    assert COUNTER not in {b.name for b in broken}


async def test_a_server_that_cannot_start_fails_the_job_start_in_one_line(
    tmp_path: Path, nemo_gym_python: Path
) -> None:
    folder = tmp_path / "environments" / "ng_nowhere"
    folder.mkdir(parents=True)
    (folder / "nemo_gym.toml").write_text(f'server = "no_such_server"\npython = "{nemo_gym_python}"\n')
    roots = RootsConfig(Path("/nonexistent"), (tmp_path,), BUILTIN_ROOT, False)
    service = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await service.start()
    try:
        manager = JobManager(
            Catalog([Root(BUILTIN_ROOT, 0, "root")]),
            model=GatewayModel.in_process(GatewayServicer(Gateway([FakeBackend("tiny")]))),
            env=VerifierEnv.in_process(VerifierServicer(service)),
        )
        data = tmp_path / "rows.jsonl"
        data.write_text(json.dumps({"responses_create_params": {"input": "hi"}}) + "\n")
        with pytest.raises(Exception) as err:
            await manager.submit(
                JobSpec(dataset=str(data), environment="ng_nowhere", output_dir=str(tmp_path))
            )
    finally:
        await service.aclose()
    msg = str(getattr(err.value, "message", err.value))
    assert "\n" not in msg and str(nemo_gym_python) in msg and "no_such_server" in msg
    assert "exited with code 1" in msg and "log: " in msg and ".log" in msg
