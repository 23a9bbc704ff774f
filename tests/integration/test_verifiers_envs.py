"""verifiers (0.3.x) environments behind the bridge, end to end: environments written here in
verifiers' own API (tests/verifiers_envs/: a ToolEnv with two tools, a SingleTurnEnv with a rubric of
three weighted functions) run by the scheduler's job manager against a verifier (gRPC, API key)
managing each in the verifiers virtualenv, the fake model playing them through the real gateway.
The rows are the environments' own datasets (`_verifiers_server.py rows`); the tools run in
verifiers' `env_response`; the reward is verifiers' `rubric.score_rollout`. Then `rollmesh reverify`
of the stored rows, and verifiers scoring the same stored completions in its own process (a script
in the venv that never imports the bridge), both give exactly the rewards the job stored."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.devtools.fake_scripts import describes_by_seed
from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
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
from rollmesh.verifier.bridges.verifiers_env import LAUNCHER
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer

ENVS = Path(__file__).resolve().parent.parent / "verifiers_envs"
API_KEY = "verifiers-bridge-test-key"
_LAST_USER = re.compile(r"<\|user\|>\n(.*?)<\|end\|>", re.S)
_TOOL_OUT = re.compile(r"<\|tool\|>\n(.*?)<\|end\|>", re.S)


def plays(prompt_text: str, request: EngineRequest) -> str:
    """The fake model. "Compute (A + B) * C.": calls add(A, B), then multiply(sum, C), then says the
    product (one more than it when C is 3: a wrong answer). "What is A + B?": "The answer is A+B."
    (when A is 7: "I think A+B+1", wrong). "Describe the number N.": N and then some " ha", as many as
    the request's seed says (fake_scripts.describes_by_seed: a task's rollouts answer differently)."""
    users = _LAST_USER.findall(prompt_text)
    asked = users[-1] if users else ""
    if m := re.search(r"Compute \((\d+) \+ (\d+)\) \* (\d+)", asked):
        a, b, c = (int(x) for x in m.groups())
        outs = _TOOL_OUT.findall(prompt_text)
        if not outs:
            return f"<tool_call>{json.dumps({'name': 'add', 'arguments': {'a': a, 'b': b}})}</tool_call>"
        if len(outs) == 1:
            call = {"name": "multiply", "arguments": {"a": int(outs[0].strip()), "b": c}}
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        product = int(outs[-1].strip())
        return f"The result is {product + 1 if c == 3 else product}."
    if m := re.search(r"counter starts at (\d+)\. Add (\d+)", asked):
        outs = _TOOL_OUT.findall(prompt_text)
        if not outs:
            call = {"name": "increment", "arguments": {"by": int(m.group(2))}}
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        if len(outs) == 1:
            return '<tool_call>{"name": "read", "arguments": {}}</tool_call>'
        return f"The counter is {outs[-1].strip()}."
    if "Guess my number" in prompt_text:
        lo, hi = 1, 8
        guesses = [int(g) for g in re.findall(r"<\|assistant\|>\n(\d+)", prompt_text)]
        for guess, hint in zip(
            guesses, re.findall(r"<\|user\|>\n(higher|lower)<", prompt_text), strict=False
        ):
            lo, hi = (guess + 1, hi) if hint == "higher" else (lo, guess - 1)
        return str((lo + hi) // 2)
    if "Describe the number" in asked:
        return describes_by_seed(prompt_text, request)
    if m := re.search(r"What is (\d+) \+ (\d+)\?", asked):
        a, b = int(m.group(1)), int(m.group(2))
        return f"I think {a + b + 1}" if a == 7 else f"The answer is {a + b}."
    return "?"


@dataclass
class Mesh:
    address: str
    gateway: GatewayServicer
    verifier: VerifierServicer


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory, verifiers_python: Path) -> AsyncIterator[Mesh]:
    root = tmp_path_factory.mktemp("vf-root")
    envs = [(e, e, "") for e in ("vf_calc", "vf_rubric", "vf_counter", "vf_guess", "vf_group", "vf_raises")]
    for name, env_id, extra in [*envs, ("vf_raises_math", "vf_raises", "[args]\nmath = true\n")]:
        folder = root / "environments" / name
        folder.mkdir(parents=True)
        toml = f'env_id = "{env_id}"\npython = "{verifiers_python}"\npaths = ["{ENVS}"]\n{extra}'
        (folder / "verifiers.toml").write_text(toml)
    roots = RootsConfig(Path("/nonexistent"), (root,), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await svc.start()
    gateway = Gateway([FakeBackend("tiny", script=plays, max_model_len=8192)])
    await gateway.start()
    verifier = VerifierServicer(svc)
    server = await build_server([ServiceBinding.of(verifier)], api_key=API_KEY)
    await server.start()
    try:
        _, broken = svc.list_environments()
        assert not broken, "; ".join(f"{b.name}: {b.error}" for b in broken)
        await wait_serving(server.address, timeout_s=30)
        yield Mesh(server.address, GatewayServicer(gateway), verifier)
    finally:
        await server.stop(grace=0)
        await svc.aclose()
        await gateway.shutdown()


def vf_rows(python: Path, env_id: str) -> list[dict[str, Any]]:
    """The environment's dataset as rollmesh rows, the command docs/verifiers.md gives."""
    argv = [str(python), str(LAUNCHER), "rows", "--env-id", env_id, "--path", str(ENVS)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    return [json.loads(ln) for ln in done.stdout.splitlines() if ln.strip()]


# verifiers' own loop and scoring of stored rollouts, in the verifiers venv (imports nothing of
# rollmesh): the environment's `rollout` (its init_state, setup_state, stop conditions, env_response,
# tools and render_completion) with the model's turns replayed from the stored row, then its
# rubric's score_rollout (with "group": score_group over the rollouts of each item's "group", as
# verifiers scores a group rubric). It prints each rollout's completion as verifiers rendered it and
# its score.
OWN_SCORING = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[2])
import verifiers as vf
from verifiers.types import ClientConfig, Response, ResponseMessage
from verifiers.utils.message_utils import normalize_messages

async def main():
    env = vf.load_environment(sys.argv[1])
    items, states = json.loads(sys.stdin.read()), []
    for item in items:
        turns = [m for m in normalize_messages(item["completion"], field_name="c") if m.role == "assistant"]

        async def replay(state, prompt, **kwargs):
            m = turns.pop(0)
            msg = ResponseMessage(content=m.content, tool_calls=m.tool_calls, finish_reason="stop",
                                  is_truncated=False)
            return Response(id="r", created=int(time.time()), model="m", message=msg)

        env.get_model_response = replay
        client = ClientConfig(api_base_url="http://127.0.0.1:9/v1", api_key_var="UNUSED")
        states.append(await env.rollout(item["input"], client, "m"))
    groups = {}
    for item, state in zip(items, states):
        groups.setdefault(item.get("group", len(groups)), []).append(state)
    for group in groups.values():
        if sys.argv[3] == "group":
            await env.rubric.score_group(group)
        else:
            await env.rubric.score_rollout(group[0])
    out = []
    for state in states:
        completion = [m.model_dump(exclude_none=True) for m in state["completion"]]
        out.append({"reward": state["reward"], "metrics": state["metrics"], "completion": completion})
    print(json.dumps(out))

asyncio.run(main())
"""


def own_scores(
    python: Path, env_id: str, rows: list[dict[str, Any]], *, group: bool = False
) -> list[dict[str, Any]]:
    """verifiers' own scores of stored rows, in its venv; `group`: each task's rows scored together."""
    items = [
        {
            "input": {"prompt": r["responses_create_params"]["input"], **r["verifier_metadata"]["verifiers"]},
            "completion": r["chat_messages"],
            **({"group": r["task_index"]} if group else {}),
        }
        for r in rows
    ]
    done = subprocess.run(
        [str(python), "-c", OWN_SCORING, env_id, str(ENVS), "group" if group else "rollout"],
        input=json.dumps(items),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "VIRTUAL_ENV"))},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    scores: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return scores


async def submit(
    mesh: Mesh, rows: list[dict[str, Any]], environment: str, out: Path, *, num_repeats: int = 1
) -> Any:
    data = out / "rows.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manager = JobManager(
        Catalog([Root(BUILTIN_ROOT, 0, "root")]),
        model=GatewayModel.in_process(mesh.gateway),
        env=VerifierEnv.in_process(mesh.verifier),
    )
    spec = JobSpec(
        dataset=str(data),
        environment=environment,
        max_steps=8,
        sampling={"temperature": 0.0, "max_tokens": 128},
        concurrency=4,
        num_repeats=num_repeats,
        output_dir=str(out),
        retry=RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2),
    )
    return await manager.wait((await manager.submit(spec)).job_id)


async def run_job(
    mesh: Mesh, rows: list[dict[str, Any]], environment: str, out: Path
) -> list[dict[str, Any]]:
    rec = await submit(mesh, rows, environment, out)
    assert rec.state == "SUCCEEDED", rec
    path = out / rec.job_id / "rollouts.jsonl"
    assert len(store.load_files([path]).rollouts) == len(rows)
    got = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return sorted(got, key=lambda r: r["task_index"])


async def stored_and_failed(
    mesh: Mesh, rows: list[dict[str, Any]], environment: str, out: Path
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """Run a job; its final state, its stored rows and its failure rows."""
    rec = await submit(mesh, rows, environment, out)
    folder = out / rec.job_id

    def read(name: str) -> list[dict[str, Any]]:
        path = folder / name
        text = path.read_text() if path.exists() else ""
        return [json.loads(ln) for ln in text.splitlines() if ln.strip()]

    return rec.state, read("rollouts.jsonl"), read("failures.jsonl")


async def reverify(mesh: Mesh, rollouts: Path, environment: str, out: Path) -> list[dict[str, Any]]:
    args = ["reverify", str(rollouts), "-e", environment, "--verifier", mesh.address]
    args += ["--api-key", API_KEY, "-o", str(out)]
    res = await asyncio.to_thread(CliRunner().invoke, build_app(), args)
    assert res.exit_code == 0, res.output
    text = await asyncio.to_thread(out.read_text)
    return [json.loads(ln) for ln in text.splitlines() if ln.strip()]


async def check_reverify_and_own_scoring(
    mesh: Mesh, python: Path, env_id: str, got: list[dict[str, Any]], tmp_path: Path
) -> None:
    stored = tmp_path / "stored.jsonl"
    stored.write_text("".join(json.dumps(r) + "\n" for r in got))
    again = await reverify(mesh, stored, env_id, tmp_path / "reverified.jsonl")
    assert [r.get("reverify_error") for r in again] == [None] * len(got)
    assert [r["reward"] for r in again] == [r["reward"] for r in got]
    own = await asyncio.to_thread(own_scores, python, env_id, got)
    assert [o["reward"] for o in own] == [r["reward"] for r in got]
    for o, r in zip(own, got, strict=True):
        assert {k: float(v) for k, v in o["metrics"].items()} == r["reward_components"]
        # verifiers' own loop made the same conversation from the same model turns
        assert [(m["role"], str(m.get("content") or "")) for m in o["completion"]] == [
            (m["role"], m["content"]) for m in r["chat_messages"]
        ]


@pytest.mark.asyncio(loop_scope="module")
async def test_tool_env_runs_its_own_tools_and_rubric(
    mesh: Mesh, verifiers_python: Path, tmp_path: Path
) -> None:
    rows = vf_rows(verifiers_python, "vf_calc")
    assert len(rows) == 4 and rows[0]["responses_create_params"]["input"][0]["role"] == "system"
    got = await run_job(mesh, rows, "vf_calc", tmp_path / "runs")
    for row in got:
        calls = [c["function"]["name"] for m in row["chat_messages"] for c in m.get("tool_calls") or []]
        tools = [m["content"] for m in row["chat_messages"] if m["role"] == "tool"]
        assert calls == ["add", "multiply"]
        assert tools[-1] == row["expected_answer"]  # verifiers' own tools answered (A + B) * C
        wrong = row["responses_create_params"]["input"][-1]["content"].endswith("* 3.")
        # correct (weight 1.0) + both tools used (1.0, weight 0.5)
        assert row["reward"] == (0.5 if wrong else 1.5), row
        assert row["reward_components"]["add_calls"] == 1.0 and row["reward_components"]["num_turns"] == 3.0
    await check_reverify_and_own_scoring(mesh, verifiers_python, "vf_calc", got, tmp_path)


@pytest.mark.asyncio(loop_scope="module")
async def test_single_turn_env_scores_with_its_weighted_rubric(
    mesh: Mesh, verifiers_python: Path, tmp_path: Path
) -> None:
    rows = vf_rows(verifiers_python, "vf_rubric")
    got = await run_job(mesh, rows, "vf_rubric", tmp_path / "runs")
    for row in got:
        assert [m["role"] for m in row["chat_messages"]] == ["assistant"]
        words = len(row["chat_messages"][0]["content"].split())
        right = not row["chat_messages"][0]["content"].startswith("I think")
        assert row["reward"] == pytest.approx((1.0 if right else 0.0) + 0.5 + 0.25 / (1 + words)), row
    assert sorted(r["reward"] for r in got)[0] < 1.0 < sorted(r["reward"] for r in got)[-1]
    await check_reverify_and_own_scoring(mesh, verifiers_python, "vf_rubric", got, tmp_path)


@pytest.mark.asyncio(loop_scope="module")
async def test_stateful_tool_env_injects_the_sessions_arguments(
    mesh: Mesh, verifiers_python: Path, tmp_path: Path
) -> None:
    rows = vf_rows(verifiers_python, "vf_counter")
    got = await run_job(mesh, rows, "vf_counter", tmp_path / "runs")
    for row in got:
        start = row["verifier_metadata"]["verifiers"]["info"]["start"]
        tools = [m["content"] for m in row["chat_messages"] if m["role"] == "tool"]
        # the counter lived in verifiers' state for the session: increment from the row's start, read it
        assert tools == [row["expected_answer"]] * 2 and int(row["expected_answer"]) > start
        assert row["reward"] == 1.0, row
    await check_reverify_and_own_scoring(mesh, verifiers_python, "vf_counter", got, tmp_path)


@pytest.mark.asyncio(loop_scope="module")
async def test_multi_turn_game_ends_on_its_final_env_response(
    mesh: Mesh, verifiers_python: Path, tmp_path: Path
) -> None:
    rows = vf_rows(verifiers_python, "vf_guess")
    got = await run_job(mesh, rows, "vf_guess", tmp_path / "runs")
    turns = {3: 3, 6: 2, 8: 4}  # binary search over 1..8: 4 -> 2 -> 3, 4 -> 6, 4 -> 6 -> 7 -> 8
    for row in got:
        target = int(row["expected_answer"])
        said = [m["content"] for m in row["chat_messages"] if m["role"] == "assistant"]
        assert len(said) == turns[target] and said[-1] == str(target), said
        last = row["chat_messages"][-1]  # the final_env_response, as verifiers' completion has it
        assert (last["role"], last["content"]) == ("user", "Correct!") and row["env_steps"][-1]["done"]
        assert row["reward"] == pytest.approx(1.0 + 0.5 / turns[target]), row
    await check_reverify_and_own_scoring(mesh, verifiers_python, "vf_guess", got, tmp_path)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_group_rubric_scores_each_tasks_rollouts_together_as_verifiers_does(
    mesh: Mesh, verifiers_python: Path, tmp_path: Path
) -> None:
    """vf_group (longest_wins over the group + says_the_number): 3 rollouts per task, the fake model
    answering each at another length; verified together, their rows hold verifiers' own
    `score_group` of the same completions in its venv, reward and metrics."""
    rows = vf_rows(verifiers_python, "vf_group")
    rec = await submit(mesh, rows, "vf_group", tmp_path / "runs", num_repeats=3)
    assert rec.state == "SUCCEEDED", rec
    path = tmp_path / "runs" / rec.job_id / "rollouts.jsonl"
    got = sorted(
        (json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()),
        key=lambda r: (r["task_index"], r["rollout_index"]),
    )
    assert len(got) == 3 * len(rows) == 9
    for task in range(len(rows)):
        group = [r for r in got if r["task_index"] == task]
        sizes = [len(r["chat_messages"][-1]["content"]) for r in group]
        assert len(set(sizes)) == 3  # the group's answers differ in length
        # the longest of the group wins (1.0) and every answer starts with the number (0.5)
        assert [r["reward"] for r in group] == [1.5 if s == max(sizes) else 0.5 for s in sizes], group
    own = await asyncio.to_thread(own_scores, verifiers_python, "vf_group", got, group=True)
    assert [o["reward"] for o in own] == [r["reward"] for r in got]
    for o, r in zip(own, got, strict=True):
        assert {k: float(v) for k, v in o["metrics"].items()} == r["reward_components"]
    # `rollmesh reverify` re-scores a task's stored group together (each member replayed, no session)
    again = await reverify(mesh, path, "vf_group", tmp_path / "reverified.jsonl")
    assert [r.get("reverify_error") for r in again] == [None] * len(got)
    by_key = {(r["task_index"], r["rollout_index"]): r for r in again}
    assert [by_key[(r["task_index"], r["rollout_index"])]["reward"] for r in got] == [
        r["reward"] for r in got
    ]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("environment", "failing", "says"),
    [
        ("vf_raises", [1], "Error calling reward function exact: the grader's lookup table has no entry"),
        ("vf_raises_math", [0, 1], "Math verification exceeded time limit"),
    ],
)
async def test_scoring_that_verifiers_counts_0_without_a_verdict_fails_by_name(
    mesh: Mesh, verifiers_python: Path, tmp_path: Path, environment: str, failing: list[int], says: str
) -> None:
    """vf_raises: a reward function that raises on task 1 (verifiers logs it and counts 0);
    vf_raises_math: a MathRubric whose math-verify overruns its time limit on every task (verifiers
    counts 0, a debug record). Each such verify fails REWARD_FUNCTION_FAILED; no row stores a reward."""
    rows = vf_rows(verifiers_python, "vf_raises")
    state, stored, failed = await stored_and_failed(mesh, rows, environment, tmp_path / "runs")
    assert state == ("FAILED" if len(failing) == len(rows) else "COMPLETED_WITH_FAILURES"), failed
    assert sorted(f["task_index"] for f in failed) == failing
    assert {f["error_class"] for f in failed} == {"REWARD_FUNCTION_FAILED"}
    assert all(says in f["message"] for f in failed), failed
    assert sorted(r["task_index"] for r in stored) == sorted(set(range(len(rows))) - set(failing))
    assert [r["reward"] for r in stored] == [1.0] * len(stored)  # the others scored, none 0
    # `rollmesh reverify` of a stored completion moved onto the failing task (its session-less
    # replay) stops on the named failure, with no reward written
    if stored:
        moved = {
            **stored[0],
            **{k: rows[failing[0]][k] for k in ("responses_create_params", "verifier_metadata")},
        }
        moved["expected_answer"] = rows[failing[0]]["expected_answer"]
        path = tmp_path / "moved.jsonl"
        path.write_text(json.dumps(moved) + "\n")
        args = ["reverify", str(path), "-e", environment, "--verifier", mesh.address, "--api-key", API_KEY]
        res = await asyncio.to_thread(
            CliRunner().invoke, build_app(), [*args, "-o", str(tmp_path / "re.jsonl")]
        )
        assert res.exit_code == 1 and "[REWARD_FUNCTION_FAILED]" in res.output and says in res.output, (
            res.output
        )
        assert (
            not (tmp_path / "re.jsonl").exists()
            or '"previous_reward"' not in (tmp_path / "re.jsonl").read_text()
        )
