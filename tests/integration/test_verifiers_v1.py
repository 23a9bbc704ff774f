"""verifiers 0.4 (`verifiers.v1`) tasksets behind the bridge, end to end: tasksets written here in
verifiers' own API (tests/verifiers_envs/: vf_v1_calc, a Task with two weighted rewards and a local
Toolset; vf_v1_judged, a Task with a metric and verifiers' built-in `reference` judge plugged as
config) run by the scheduler's job manager against a verifier (gRPC, API key) managing each in the
verifiers 0.4 virtualenv, the fake model playing them through the real gateway. The judge is pointed
at the gateway's OpenAI facade (VerifierConfig.judge_url), so the mesh's own (fake) model judges.
Then `rollmesh reverify` of the stored rows, and verifiers scoring the same stored completions in its
own process (a script in the venv that never imports the bridge: `Task.score` on a verifiers Trace,
as `vf replay` re-scores), both give exactly the rewards the job stored."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.http import HttpFacade
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.config import ServerConfig
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.verifiers_env import LAUNCHER_V1
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.integration.test_verifiers_envs import API_KEY
from tests.integration.test_verifiers_envs import ENVS
from tests.integration.test_verifiers_envs import Mesh
from tests.integration.test_verifiers_envs import check_reverify_and_own_scoring as check_v03
from tests.integration.test_verifiers_envs import plays
from tests.integration.test_verifiers_envs import reverify
from tests.integration.test_verifiers_envs import run_job
from tests.integration.test_verifiers_envs import stored_and_failed
from tests.integration.test_verifiers_envs import vf_rows

_JUDGE = re.compile(
    r"(?:Reference|Ground truth) answer:\n```\n(.*?)\n```\n\nResponse:\n```\n(.*?)\n```", re.S
)
JUDGED_CONFIG = '[[config.task.judges]]\nid = "reference"\n'


@dataclass
class V1Mesh(Mesh):
    facade: str  # the gateway's OpenAI facade (base URL)


def plays_v1(prompt_text: str, request: EngineRequest) -> str:
    """The fake model: the 0.3 tests' player, and the judge: "yes" when the response holds the
    reference answer as a word, else "no"."""
    if m := _JUDGE.search(prompt_text):
        answer, response = m.group(1).strip(), m.group(2)
        return "yes" if answer in response.rstrip(".").split() else "no"
    return plays(prompt_text, request)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def mesh(
    tmp_path_factory: pytest.TempPathFactory, verifiers_v1_python: Path, verifiers_python: Path
) -> AsyncIterator[V1Mesh]:
    # "tiny" serves the jobs and rollmesh's judges (the default model); "gpt-4.1-nano" is the model a
    # verifiers 0.3 JudgeRubric asks by default, for verifiers' own scoring pointed at this facade.
    judge = FakeBackend("gpt-4.1-nano", script=plays_v1, max_model_len=8192)
    gateway = Gateway([FakeBackend("tiny", script=plays_v1, max_model_len=8192), judge])
    await gateway.start()
    http = HttpFacade(gateway, host="127.0.0.1", port=0, api_key=API_KEY)
    await http.start()
    root = tmp_path_factory.mktemp("vf1-root")
    for taskset, extra in (("vf_v1_calc", ""), ("vf_v1_judged", JUDGED_CONFIG), ("vf_v1_raises", "")):
        folder = root / "environments" / taskset
        folder.mkdir(parents=True)
        toml = f'taskset = "{taskset}"\npython = "{verifiers_v1_python}"\npaths = ["{ENVS}"]\n{extra}'
        (folder / "verifiers.toml").write_text(toml)
    folder = root / "environments" / "vf_judged"  # a verifiers 0.3 JudgeRubric, in the 0.3.1 venv
    folder.mkdir(parents=True)
    (folder / "verifiers.toml").write_text(
        f'env_id = "vf_judged"\npython = "{verifiers_python}"\npaths = ["{ENVS}"]\n'
    )
    roots = RootsConfig(Path("/nonexistent"), (root,), BUILTIN_ROOT, False)
    cfg = VerifierConfig(server=replace(ServerConfig(), api_key=API_KEY), judge_url=http.base_url)
    svc = VerifierService.from_catalog(cfg, Catalog.from_config(roots), entry_points=False)
    await svc.start()
    verifier = VerifierServicer(svc)
    server = await build_server([ServiceBinding.of(verifier)], api_key=API_KEY)
    await server.start()
    try:
        _, broken = svc.list_environments()
        assert not broken, "; ".join(f"{b.name}: {b.error}" for b in broken)
        await wait_serving(server.address, timeout_s=30)
        yield V1Mesh(server.address, GatewayServicer(gateway), verifier, http.base_url)
    finally:
        await server.stop(grace=0)
        await svc.aclose()
        await http.stop()
        await gateway.shutdown()


def v1_rows(python: Path, taskset: str) -> list[dict[str, Any]]:
    """The taskset's tasks as rollmesh rows, the command docs/verifiers.md gives."""
    argv = [str(python), str(LAUNCHER_V1), "rows", "--taskset", taskset, "--path", str(ENVS)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    return [json.loads(ln) for ln in done.stdout.splitlines() if ln.strip()]


# verifiers' own scoring of stored rollouts, in the venv (imports nothing of rollmesh): the taskset's
# config as verifiers validates it (the judge at the same facade), each Task rebuilt from its stored
# data, a Trace of the stored messages, `Task.score(trace)` (what `vf replay` runs): reward and scores.
OWN_SCORING = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[2])
from verifiers.v1 import AgentConfig, MessageNode, Trace
from verifiers.v1.dialects.chat import parse_message
from verifiers.v1.trace import AgentInfo, TraceTask
from verifiers.v1.utils.loaders import taskset_class, taskset_config_type

async def main():
    job = json.loads(sys.stdin.read())
    config = taskset_config_type(sys.argv[1]).model_validate({"id": sys.argv[1], **job["config"]})
    cls = taskset_class(sys.argv[1]).task_type()
    out = []
    for item in job["items"]:
        task = cls(cls.data_type().model_validate(item["data"]), config.task)
        nodes = []
        for i, m in enumerate(item["messages"]):
            sampled = m["role"] == "assistant"
            nodes.append(MessageNode(parent=i - 1 if i else None, message=parse_message(m), sampled=sampled))
        trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data),
            agent=AgentInfo(config=AgentConfig()),
            nodes=nodes,
        )
        await task.score(trace)
        scores = {k: r.score for k, r in trace.rewards.items()} | dict(trace.metrics)
        out.append({"reward": trace.reward, "scores": scores})
    print(json.dumps(out))

asyncio.run(main())
"""


def own_scores(python: Path, taskset: str, config: dict[str, Any], rows: list[dict[str, Any]]) -> Any:
    items = [
        {
            "data": r["verifier_metadata"]["verifiers"]["data"],
            "messages": r["responses_create_params"]["input"] + r["chat_messages"],
        }
        for r in rows
    ]
    done = subprocess.run(
        [str(python), "-c", OWN_SCORING, taskset, str(ENVS)],
        input=json.dumps({"config": config, "items": items}),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV"))},
            "OWN_JUDGE_KEY": API_KEY,
        },
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


async def check_reverify_and_own_scoring(
    mesh: Mesh, python: Path, taskset: str, config: dict[str, Any], got: list[dict[str, Any]], tmp_path: Path
) -> None:
    stored = tmp_path / "stored.jsonl"
    stored.write_text("".join(json.dumps(r) + "\n" for r in got))
    again = await reverify(mesh, stored, taskset, tmp_path / "reverified.jsonl")
    assert [r.get("reverify_error") for r in again] == [None] * len(got)
    assert [r["reward"] for r in again] == [r["reward"] for r in got]
    own = await asyncio.to_thread(own_scores, python, taskset, config, got)
    assert [o["reward"] for o in own] == [r["reward"] for r in got]
    assert [o["scores"] for o in own] == [r["reward_components"] for r in got]


@pytest.mark.asyncio(loop_scope="module")
async def test_taskset_with_a_toolset_runs_its_tools_and_rewards(
    mesh: Mesh, verifiers_v1_python: Path, tmp_path: Path
) -> None:
    rows = v1_rows(verifiers_v1_python, "vf_v1_calc")
    assert len(rows) == 4 and [m["role"] for m in rows[0]["responses_create_params"]["input"]] == [
        "system",
        "user",
    ]
    got = await run_job(mesh, rows, "vf_v1_calc", tmp_path / "runs")
    for row in got:
        calls = [c["function"]["name"] for m in row["chat_messages"] for c in m.get("tool_calls") or []]
        tools = [m["content"] for m in row["chat_messages"] if m["role"] == "tool"]
        assert calls == ["add", "multiply"]
        assert tools[-1] == row["expected_answer"]  # the Toolset's own tools answered (A + B) * C
        wrong = row["responses_create_params"]["input"][-1]["content"].endswith("* 3.")
        # correct (weight 1.0) + both tools used (1.0, weight 0.5)
        assert row["reward"] == (0.5 if wrong else 1.5), row
        assert row["reward_components"] == {"correct": 0.0 if wrong else 1.0, "used_tools": 1.0}
    await check_reverify_and_own_scoring(mesh, verifiers_v1_python, "vf_v1_calc", {}, got, tmp_path)


@pytest.mark.asyncio(loop_scope="module")
async def test_taskset_with_a_metric_and_a_judge_asks_the_mesh_model(
    mesh: V1Mesh, verifiers_v1_python: Path, tmp_path: Path
) -> None:
    rows = v1_rows(verifiers_v1_python, "vf_v1_judged")
    got = await run_job(mesh, rows, "vf_v1_judged", tmp_path / "runs")
    for row in got:
        said = row["chat_messages"][-1]["content"]
        right = not said.startswith("I think")
        # the reference judge (the fake model behind the gateway's facade) said yes exactly when right
        assert row["reward"] == (1.0 if right else 0.0), row
        assert row["reward_components"] == {
            "reference": row["reward"],
            "reply_words": float(len(said.split())),
        }
    assert sorted(r["reward"] for r in got) == [0.0, 1.0, 1.0]
    # verifiers' own scoring asks the same facade, configured as a verifiers user would
    judge = {"id": "reference", "base_url": mesh.facade, "api_key_var": "OWN_JUDGE_KEY", "model": ""}
    await check_reverify_and_own_scoring(
        mesh, verifiers_v1_python, "vf_v1_judged", {"task": {"judges": [judge]}}, got, tmp_path
    )


@pytest.mark.asyncio(loop_scope="module")
async def test_a_reward_that_raises_fails_the_verify_by_name_never_scores_0(
    mesh: Mesh, verifiers_v1_python: Path, tmp_path: Path
) -> None:
    """vf_v1_raises: its reward raises on task 1 (verifiers 0.4 raises a TaskError out of
    `Task.score`): that rollout fails REWARD_FUNCTION_FAILED, the other is scored, no row stores 0."""
    rows = v1_rows(verifiers_v1_python, "vf_v1_raises")
    state, stored, failed = await stored_and_failed(mesh, rows, "vf_v1_raises", tmp_path / "runs")
    assert state == "COMPLETED_WITH_FAILURES", failed
    assert [(f["task_index"], f["error_class"]) for f in failed] == [(1, "REWARD_FUNCTION_FAILED")]
    assert "TaskError: task SumTask scoring: RuntimeError: the grader's lookup table" in failed[0]["message"]
    assert [(r["task_index"], r["reward"]) for r in stored] == [(0, 1.0)]


@pytest.mark.parametrize(
    ("taskset", "says"),
    [
        ("vf_v1_unsupported", "task StopTask has stop hooks ['enough']: rollmesh's loop runs none"),
        ("vf_v1_stateful", "toolset Counter keeps a State of its own (CounterState)"),
        ("vf_v1_task_state", "task NotesTask keeps a State of its own (NotesState): the rollmesh bridge"),
        (
            "vf_v1_container",
            "task BoxTask needs a container (NEEDS_CONTAINER): the rollmesh bridge runs none",
        ),
        ("vf_v1_runtime", "task RunTask's ['files_made'] need a runtime (a sandbox): the rollmesh bridge"),
        ("vf_v1_own_env", "taskset 'vf_v1_own_env' ships its own Env (PairEnv): the rollmesh bridge runs"),
    ],
)
def test_what_the_bridge_cannot_run_is_refused_by_name(
    verifiers_v1_python: Path, taskset: str, says: str
) -> None:
    argv = [str(verifiers_v1_python), str(LAUNCHER_V1), "rows", "--taskset", taskset]
    done = subprocess.run(
        [*argv, "--path", str(ENVS)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode != 0 and says in done.stderr, done.stderr[-2000:]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_verifiers_03_judge_rubric_asks_the_mesh_model(
    mesh: V1Mesh, verifiers_python: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # verifiers' default judge client (`AsyncOpenAI()`) reads these when the environment loads: for the
    # `rows` export and verifiers' own scoring, pointed at the same facade as a verifiers user would
    monkeypatch.setenv("OPENAI_BASE_URL", mesh.facade)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    rows = vf_rows(verifiers_python, "vf_judged")
    got = await run_job(mesh, rows, "vf_judged", tmp_path / "runs")
    # the JudgeRubric built with verifiers' defaults asked the gateway's facade: yes exactly when right
    assert [r["reward"] for r in got] == [1.0, 0.0, 1.0]
    assert [r["chat_messages"][-1]["content"] for r in got] == [
        "The answer is 4.",
        "I think 13",
        "The answer is 7.",
    ]
    await check_v03(mesh, verifiers_python, "vf_judged", got, tmp_path)


# The 0.3 server's Host scoring vf_judged with its judge pointed at a port nobody serves.
_DEAD_JUDGE = r"""
import asyncio, sys
sys.path.insert(0, sys.argv[1])
import _verifiers_server as s

async def main():
    judge = {"base_url": "http://127.0.0.1:9/v1", "model": "", "api_key_var": "OPENAI_API_KEY"}
    host = s.Host(s.load({"env_id": "vf_judged", "paths": [sys.argv[2]], "judge": judge}))
    completion = [{"role": "assistant", "content": "The answer is 4."}]
    state = await host.replay(host.rows(1)[0], completion)
    try:
        print("SCORED", await host.score(state, completion))
    except s.RewardFunctionFailed as exc:
        print("FAILED", exc)

asyncio.run(main())
"""


def test_a_judge_that_cannot_answer_fails_the_verify_never_scores_0(verifiers_python: Path) -> None:
    done = subprocess.run(
        [str(verifiers_python), "-c", _DEAD_JUDGE, str(LAUNCHER_V1.parent), str(ENVS)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "OPENAI_API_KEY": "unused"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("FAILED Error calling reward function judged") and "scored it 0" in last, last
