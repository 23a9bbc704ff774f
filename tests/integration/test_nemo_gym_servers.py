"""NeMo Gym's own resources servers, served as they are (managed: each started by the verifier from
a NeMo Gym virtualenv, scripts/nemo_gym.py venv), reproduce the rewards NeMo Gym recorded when
`rollmesh reverify` re-scores their recorded rollouts through a real verifier (gRPC, with an API
key). Each test runs for NeMo Gym 0.4.0 (pyenv's 3.12) and 0.7.0 (Python >= 3.13.14: Debian forky's,
scripts/debian_root.py), each version's own servers against its own recorded rows:
0.7.0's servers add /close_session and /reverify_mode and answer `mask_sample` / `failure_kind`.

Each server's `data/example_rollouts.jsonl` holds rollouts NeMo Gym ran and the reward its own
agent got; they are in completion order and lack row fields verify needs (`expected_count`, ...), so
`--tasks data/example.jsonl` joins each back to its row by the input messages. Through the bridge
a rollout replays on the real server (seed, the executed tool calls, verify; a gymnasium server:
reset and a step per assistant turn) and must give the recorded reward exactly.
"""

from __future__ import annotations

import asyncio
import json
from asyncio.subprocess import DEVNULL
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.mesh.responses_items import response_messages
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.nemo_gym import NemoGymEnvironment
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from tests.conftest import nemo_gym_assets
from tests.conftest import nemo_gym_python_of

API_KEY = "nemo-gym-bridge-test-key"
SERVERS = (
    "example_single_tool_call",
    "example_session_state_mgmt",
    "example_tool_call_multireward",
    "example_multi_step",
    "math_with_judge",
    "mcqa",
    "xlam_fc",
    "reasoning_gym",
    "example_multi_turn_gymnasium",
    "equivalence_rule",
    "format_verification",
    "arc_agi",
    "mrcr",
    "hotpotqa_qa",
    "bunsenbench_chemistry_mcq",
)
# Their recorded rollouts come from other rows than data/example.jsonl and carry no verify fields
# (no ground_truth, schema): nothing can recompute their rewards, so the bridge must refuse them.
UNJOINABLE = ("workplace_assistant", "math_advanced_calculations", "structured_outputs")
# Server config set over the YAML's (math_with_judge: math-verify only, no LLM judge).
# math_with_judge: math-verify only (no LLM judge), and time for its check on a loaded machine:
# NeMo Gym scores a check that overruns library_verifier_timeout_seconds (10 s) 0, and one recorded
# row ((2+sqrt 3)^2016 against (1+sqrt 3)^4033) takes longer than that on two busy cores.
OVERRIDES: dict[str, str] = {
    "math_with_judge": "[overrides]\nshould_use_judge = false\nlibrary_verifier_timeout_seconds = 120\n"
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@dataclass(frozen=True)
class Gym:
    """A verifier (gRPC, API key) hosting every server below of one NeMo Gym version as `ng_<server>`."""

    version: str
    address: str
    servers: Path  # that version's resources_servers/
    python: Path  # its virtualenv's interpreter
    service: VerifierService


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gym(
    nemo_gym_python_each: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gym]:
    version, python = nemo_gym_python_each
    root = tmp_path_factory.mktemp(f"gym-root-{version}")
    for name in (*SERVERS, *UNJOINABLE):
        folder = root / "environments" / f"ng_{name}"  # (a built-in reasoning_gym exists)
        folder.mkdir(parents=True)
        toml = f'server = "{name}"\npython = "{python}"\n' + OVERRIDES.get(name, "")
        (folder / "nemo_gym.toml").write_text(toml)
    roots = RootsConfig(Path("/nonexistent"), (root,), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await svc.start()
    server = await build_server([ServiceBinding.of(VerifierServicer(svc))], api_key=API_KEY)
    await server.start()
    try:
        _, broken = svc.list_environments()
        assert not broken, "; ".join(f"{b.name}: {b.error}" for b in broken)
        await wait_serving(server.address, timeout_s=30)
        yield Gym(
            version, server.address, Path(nemo_gym_assets.data(version)) / "resources_servers", python, svc
        )
    finally:
        await server.stop(grace=0)
        await svc.aclose()


async def reverify(
    address: str, server: str, folder: Path, out: Path, exit_code: int = 0
) -> tuple[list[dict[str, Any]], str]:
    """`rollmesh reverify` of the server's recorded rollouts, joined to its example rows (exit 1
    when a row could not be re-scored)."""
    data = folder / "data"
    args = ["reverify", str(data / "example_rollouts.jsonl"), "-e", f"ng_{server}"]
    args += [
        "--tasks",
        str(data / "example.jsonl"),
        "--verifier",
        address,
        "--api-key",
        API_KEY,
        "-o",
        str(out),
    ]
    res = await asyncio.to_thread(CliRunner().invoke, build_app(), args)
    assert res.exit_code == exit_code, res.output
    return read_jsonl(out), res.stderr


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("server", SERVERS)
async def test_rollmesh_reverify_reproduces_nemo_gyms_recorded_rewards(
    gym: Gym, tmp_path: Path, server: str
) -> None:
    rows, stderr = await reverify(gym.address, server, gym.servers / server, tmp_path / "out.jsonl")
    assert len(rows) == 5 and "match no row" not in stderr and "reverified 5 rows (0 errors" in stderr
    for row in rows:
        if row["reward"] != row["previous_reward"] and server == "math_with_judge":
            await assert_math_verify_timed_out(gym.python, row)
            continue
        if row["reward"] != row["previous_reward"] and (gym.version, server) == ("0.7.0", "mcqa"):
            await assert_mcqa_grading_changed(gym.python, row)
            continue
        assert row["reward"] == row["previous_reward"], f"{gym.version} {server}: {row}"


# math_with_judge's check is math-verify's `verify`, which gives up (False) after 5 s of sympy:
# NeMo Gym's own verdict depends on the machine's speed. Shown here, not assumed: the same pair of
# answers is compared in the NeMo Gym virtualenv with a short limit and without one, each in a fresh
# interpreter. (Not with the server's 5 s: the same check took 3.6 s in a fresh interpreter when the
# machine was quieter than while the server checked it, and in one interpreter the second run found
# sympy's caches warm.)
MATH_VERIFY = """
import json, sys, time
from math_verify import parse, verify
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
gold, pred, limit = json.loads(sys.stdin.read())
g = parse(gold, extraction_config=[LatexExtractionConfig()])
p = parse(pred, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()])
t0 = time.monotonic()
print(json.dumps([verify(g, p, timeout_seconds=limit), time.monotonic() - t0]))
"""


async def math_verify(python: Path, gold: str, answer: str, limit: int) -> tuple[bool, float]:
    """math-verify's verdict on `answer` within `limit` seconds, and the seconds it took."""
    proc = await asyncio.create_subprocess_exec(
        str(python), "-c", MATH_VERIFY, stdin=PIPE, stdout=PIPE, stderr=DEVNULL
    )
    out, _ = await proc.communicate(json.dumps([gold, answer, limit]).encode())
    verdict, seconds = json.loads(out.decode().strip().splitlines()[-1])
    return verdict, seconds


async def assert_math_verify_timed_out(python: Path, row: dict[str, Any]) -> None:
    answer = response_messages(row["response"])[-1].content
    assert row["previous_reward"] == 1.0 and row["reward"] == 0.0 and row["extracted_answer"], row
    limited, _ = await math_verify(python, row["expected_answer"], answer, 1)
    unlimited, seconds = await math_verify(python, row["expected_answer"], answer, 600)
    # The same answers: False within 1 s, True given the time it takes (seconds, for the message).
    assert (limited, unlimited) == (False, True), (limited, unlimited, seconds)


# NeMo Gym 0.7.0 ships mcqa's example_rollouts.jsonl unchanged from 0.4.0, but 0.7.0's strict
# grading reads a box that starts with the letter and goes on with the option's text ("\boxed{C: An
# individual ...}") as that letter, where 0.4.0's found no letter: 0.7.0's own verify disagrees with
# its own recording there. Shown, not assumed: each version's own parser, in its own virtualenv,
# on the recorded answer.
MCQA_STRICT = """
import json, sys
from resources_servers.mcqa.app import _parse_answer_letter_strict_boxed
text, letters = json.loads(sys.stdin.read())
print(json.dumps(_parse_answer_letter_strict_boxed(text, set(letters))[0]))
"""


async def assert_mcqa_grading_changed(python: Path, row: dict[str, Any]) -> None:
    answer = response_messages(row["response"])[-1].content
    letters = sorted(k for option in row["options"] for k in option)
    picked = {}
    for version in ("0.4.0", "0.7.0"):
        interpreter = python if version == "0.7.0" else nemo_gym_python_of(version)
        proc = await asyncio.create_subprocess_exec(
            str(interpreter), "-c", MCQA_STRICT, stdin=PIPE, stdout=PIPE, stderr=DEVNULL
        )
        out, _ = await proc.communicate(json.dumps([answer, letters]).encode())
        picked[version] = json.loads(out.decode().strip().splitlines()[-1])
    assert row["grading_mode"] == "strict_single_letter_boxed", row
    assert (row["previous_reward"], row["reward"]) == (0.0, 1.0), row
    assert picked == {"0.4.0": None, "0.7.0": row["expected_answer"]}, picked


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("server", UNJOINABLE)
async def test_rollouts_without_their_rows_are_refused_not_scored(
    gym: Gym, tmp_path: Path, server: str
) -> None:
    rows, stderr = await reverify(gym.address, server, gym.servers / server, tmp_path / "out.jsonl", 1)
    assert "5 of 5 rollouts match no row" in stderr and "reverified 0 rows (5 errors" in stderr
    assert "no mean reward (nothing was re-scored)" in stderr  # and the command failed: exit 1
    for row in rows:
        assert row["reverify_error"].startswith("BAD_TASK: ") and "(422)" in row["reverify_error"]
        assert '"missing"' in row["reverify_error"] and "previous_reward" not in row


@pytest.mark.asyncio(loop_scope="module")
async def test_the_bridge_speaks_each_versions_protocol(gym: Gym, tmp_path: Path) -> None:
    """0.7.0's servers serve /close_session and /reverify_mode (mcqa says "stateless": its rollouts
    are verified without the replay) and answer `mask_sample` / `failure_kind` with every verdict;
    0.4.0's have none of them, and the bridge calls none."""
    later = gym.version != "0.4.0"
    for name in SERVERS:
        env = gym.service.environment(f"ng_{name}")
        assert isinstance(env, NemoGymEnvironment)
        routes = env._routes  # what the bridge read from the server's OpenAPI (185 kB for 0.7.0's)
        if name == "example_multi_turn_gymnasium":  # an environment server: /reset, /step
            assert {"reset", "step"} <= routes and env.takes_turns(), (gym.version, sorted(routes))
            continue
        assert ({"close_session", "reverify_mode"} <= routes) is later, (gym.version, name, sorted(routes))
        if name == "mcqa":
            assert env._reverify_mode == ("stateless" if later else "unknown")
    rows, _ = await reverify(gym.address, "mcqa", gym.servers / "mcqa", tmp_path / "out.jsonl")
    for row in rows:  # (their rewards: the test above)
        verdict = row["verify_details"]
        assert verdict.get("mask_sample", "absent") == (False if later else "absent"), (gym.version, row)
        assert verdict.get("failure_kind", "absent") == (None if later else "absent"), (gym.version, row)
        assert not row.get("mask_sample")
