"""`rollmesh run --base-url URL` end to end: the embedded mesh on the openai backend against the
project's OpenAI test server in its own process, with a fault on every third call (a 503, which the
scheduler retries): every rollout succeeds, rewards are right and the upstream's usage is counted;
the server returns no token ids, and the rows carry no token record (and the run says so)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from rollmesh.devtools.openai_server import FaultConfig
from rollmesh.devtools.openai_server import Frequency
from rollmesh.devtools.openai_server import openai_server_process
from rollmesh.registry import BUILTIN_ROOT
from tests.procs import ROLLMESH

WEATHER = BUILTIN_ROOT / "environments" / "single_tool_call" / "data" / "example.jsonl"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _run_with_api_key(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`rollmesh run argv` with an API key on the mesh it starts (off the default path)."""
    return subprocess.run(
        [str(ROLLMESH), "run", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "ROLLMESH_API_KEY": "sekrit-for-this-test"},
    )


def test_run_against_an_openai_url_with_failing_calls(tmp_path: Path) -> None:
    faults = FaultConfig(fail_statuses=(503,), fail=Frequency(every=3), retry_after_s=0.1)
    with openai_server_process(faults) as (url, _):
        done = subprocess.run(
            [
                str(ROLLMESH),
                "run",
                "--benchmark",
                "arithmetic",
                "--limit",
                "6",
                "-n",
                "2",
                "--base-url",
                url,
                "--model",
                "tiny",
                "--logprobs",
                "--output-dir",
                str(tmp_path),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and result["failure_summary"] == []
    metrics = result["metrics"]
    assert metrics["num_rollouts"] == 12 and metrics["mean_reward"] == 1.0
    assert metrics["mean_completion_tokens"] == 4.0  # "The answer is N.", as the upstream counted it
    rows = [json.loads(line) for line in Path(result["paths"]["rollouts.jsonl"]).open()]
    assert len(rows) == 12 and max(r["attempts"] for r in rows) >= 2  # some calls were retried
    # A plain OpenAI server returns no token ids (nor, here, logprobs): the rows say they have no
    # token record, rather than spans of zero length or zeros passed off as logprobs.
    empty = {"token_ids": [], "loss_mask": [], "logprobs": [], "logprobs_recorded": False, "turns": []}
    assert all(r["tokens"] == empty for r in rows)
    assert "returned no token ids" in done.stderr


@pytest.mark.parametrize(
    ("finish_reason", "argv"),
    [
        ("length", ["--environment", "single_tool_call", "--dataset", str(WEATHER), "--limit", "2"]),
        ("", ["--benchmark", "arithmetic", "--limit", "2"]),
    ],
    ids=["length", "null"],
)
def test_a_cut_or_unnamed_end_is_recorded_as_such(
    tmp_path: Path, finish_reason: str, argv: list[str]
) -> None:
    """Off the default path (an API key on the mesh, an external server): a turn the server cut by
    length with a whole tool call in it was "tool_calls" (the tool ran, the next turn answered: the
    row said "stop"); an answer with finish_reason null was "stop". Now the rows say "length" (no
    tool run, one model call per rollout) and "unknown"."""
    faults = FaultConfig(answer=CALL, finish_reason=finish_reason)
    with openai_server_process(faults) as (url, _):
        argv = [*argv, "-n", "1", "--base-url", url, "--model", "tiny", "-o", str(tmp_path), "--json"]
        done = _run_with_api_key(argv)
        calls = json.loads(urllib.request.urlopen(url.removesuffix("/v1") + "/_stats").read())["calls"]
    assert done.returncode in (0, 3), done.stderr
    rows = [json.loads(line) for line in Path(json.loads(done.stdout)["paths"]["rollouts.jsonl"]).open()]
    assert len(rows) == 2 and calls == 2  # one model call each: no tool result, no second turn
    assert {r["finish_reason"] for r in rows} == {finish_reason or "unknown"}
    if finish_reason == "length":
        assert all([m["role"] for m in r["chat_messages"]] == ["assistant"] for r in rows)
        assert all(r["chat_messages"][0]["tool_calls"] for r in rows)  # kept as generated
    else:
        assert all(r["reward"] == 1.0 for r in rows)  # still scored: "unknown" is a label, not a failure


def test_a_model_server_that_never_answers_fails_the_job_after_one_rollout_timeout(tmp_path: Path) -> None:
    """Every call hangs from the first (the gateway stays healthy): each rollout waited out
    max_attempts x rollout_timeout_s (15 min by default) and failed as DEADLINE_EXCEEDED. Now no call
    of the job answered within rollout_timeout_s fails the job then, naming the gateway."""
    with openai_server_process(FaultConfig(hang=Frequency(every=1))) as (url, _):
        argv = ["--benchmark", "arithmetic", "--limit", "2", "-n", "1", "--base-url", url, "--model", "tiny"]
        argv += ["--rollout-timeout", "4", "--unavailable-budget", "2", "-o", str(tmp_path), "--json"]
        done = _run_with_api_key(argv)
    assert done.returncode == 4, done.stderr
    result = json.loads(done.stdout)
    assert result["state"] == "FAILED" and "answered none of the job's calls" in result["error"], result
    assert [f["error_class"] for f in result["failure_summary"]] == ["GATEWAY_UNRESPONSIVE"]


def test_a_remote_model_whose_name_has_a_slash(tmp_path: Path) -> None:
    """`--model org/name` (a Hugging Face id, as a vLLM server lists it): the job asked for
    "org/name" and the embedded gateway served it as "name": every rollout failed MODEL_NOT_FOUND."""
    with openai_server_process(model="org/tiny") as (url, _):
        argv = [
            "--benchmark",
            "arithmetic",
            "--limit",
            "2",
            "-n",
            "1",
            "--base-url",
            url,
            "--model",
            "org/tiny",
        ]
        done = _run_with_api_key([*argv, "-o", str(tmp_path), "--json"])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["metrics"]["mean_reward"] == 1.0
