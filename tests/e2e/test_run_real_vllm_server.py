"""`rollmesh run --base-url` against a REAL OpenAI-compatible server: vLLM's own
(`python -m vllm.entrypoints.openai.api_server`, CPU, the shipped tiny model, `--api-key`), as a
user with a pre-hosted vLLM does it. Rewards are right, token ids and (when asked) logprobs are the
server's, and a missing or wrong key, a model the server does not serve, a base URL without `/v1`
and a server that is down each end in one line with their reason and exit code, before any rollout."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollmesh.registry import BUILTIN_ROOT
from tests.procs import ROLLMESH

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here"),
]

KEY = "vllm-test-key"
MODEL = "tiny-arith"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _models_answer(url: str) -> bool:
    request = urllib.request.Request(f"{url}/models", headers={"Authorization": f"Bearer {KEY}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's OpenAI server on CPU with the tiny model, as the serving path's replica runs it
    (eager, whole prefills: seeded requests), waited on by its /v1/models."""
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(BUILTIN_ROOT / "models" / MODEL),
        "--served-model-name",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        KEY,
        "--dtype",
        "float32",
        "--enforce-eager",
        "--no-enable-chunked-prefill",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 600
        while not _models_answer(url):
            assert proc.poll() is None, f"vLLM's server exited {proc.returncode}:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"vLLM's server not ready:\n{log.read_text()[-4000:]}"
            time.sleep(1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _run(tmp: Path, *args: str, key: str | None = KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "ROLLMESH_GATEWAY_API_KEY_ENV")}
    if key is not None:
        env["OPENAI_API_KEY"] = key  # where `rollmesh run` reads the upstream's key by default
    argv = [str(ROLLMESH), "run", "--benchmark", "arithmetic", "--output-dir", str(tmp), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)


def test_rewards_token_ids_and_logprobs_from_vllms_own_server(vllm_url: str, tmp_path: Path) -> None:
    done = _run(
        tmp_path, "--limit", "10", "-n", "4", "--logprobs", "--base-url", vllm_url, "--model", MODEL, "--json"
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    assert result["state"] == "SUCCEEDED" and result["failure_summary"] == []
    rows = [json.loads(line) for line in Path(result["paths"]["rollouts.jsonl"]).open()]
    assert len(rows) == 40
    for row in rows:
        # The reward is the arithmetic check of what the server answered.
        assert row["reward"] == float(row["extracted_answer"] == row["expected_answer"]), row
        tokens = row["tokens"]
        generated = [lp for lp, m in zip(tokens["logprobs"], tokens["loss_mask"], strict=True) if m]
        assert len(generated) == row["usage"]["completion_tokens"] > 0
        assert all(lp <= 0 for lp in generated) and any(lp < -1e-6 for lp in generated)
    # The tiny model is ~84% right per sample at T=1.0 (as on the embedded Ray Serve path).
    assert 0.2 < result["metrics"]["mean_reward"] < 1.0
    check = subprocess.run(
        [
            str(ROLLMESH),
            "validate",
            result["paths"]["rollouts.jsonl"],
            "--tokenizer",
            str(BUILTIN_ROOT / "models" / MODEL),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize(
    ("case", "code", "expected"),
    [
        ("no key", 2, "wants an API key and none was sent (HTTP 401): put it in OPENAI_API_KEY"),
        ("wrong key", 2, "refused the API key (HTTP 401) [UPSTREAM_AUTH_FAILED]"),
        ("wrong model", 2, "serves no model 'tiny-arithX'; it serves: tiny-arith [MODEL_NOT_FOUND]"),
        ("no /v1", 2, "an OpenAI-compatible base URL ends in /v1 (try http://127.0.0.1:"),
        ("server down", 1, "cannot connect"),
    ],
)
def test_a_wrong_setting_fails_at_once_in_one_line(
    vllm_url: str, tmp_path: Path, case: str, code: int, expected: str
) -> None:
    url, model, key = vllm_url, MODEL, KEY
    if case == "no key":
        key = None
    elif case == "wrong key":
        key = "not-the-key"
    elif case == "wrong model":
        model = "tiny-arithX"
    elif case == "no /v1":
        url = vllm_url.removesuffix("/v1")
    else:
        url = f"http://127.0.0.1:{_free_port()}/v1"
    done = _run(tmp_path, "--limit", "2", "--base-url", url, "--model", model, key=key)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == code, done.stderr[-4000:]
    assert len(errors) == 1 and expected in errors[0], done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*/rollouts.jsonl")), "no job may start"


def test_the_openai_facade_over_vllms_server_with_the_openai_sdk(vllm_url: str) -> None:
    """An agent that speaks only HTTP: the official `openai` SDK against the gateway's facade
    (`rollmesh serve gateway --backend openai`, both with keys), which calls vLLM's server. Unary
    and streamed answers agree at temperature 0, logprobs and token ids included."""
    openai = pytest.importorskip("openai", reason="the openai SDK is not installed here")
    from tests.procs import spawn_server

    http_port = _free_port()
    args = [
        str(ROLLMESH),
        "serve",
        "gateway",
        "--backend",
        "openai",
        "--base-url",
        vllm_url,
        "--model",
        MODEL,
    ]
    env = {
        "OPENAI_API_KEY": KEY,
        "ROLLMESH_API_KEY": "facade-key",
        "ROLLMESH_OPENAI_HTTP_PORT": str(http_port),
    }
    with spawn_server([*args, "--port", "0"], env=env, timeout_s=120):
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{http_port}/v1", api_key="facade-key", max_retries=0
        )
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        whole = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0, logprobs=True
        )
        choice = whole.choices[0]
        assert choice.message.content == "The answer is 5." and choice.finish_reason == "stop"
        unary_lps = [t.logprob for t in (choice.logprobs.content if choice.logprobs else None) or []]
        assert len(unary_lps) == len((choice.model_extra or {})["token_ids"]) > 0
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, temperature=0, logprobs=True, stream=True
        )
        text, streamed_lps = "", []
        for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
                streamed_lps += [t.logprob for t in (c.logprobs.content if c.logprobs else None) or []]
        assert text == "The answer is 5."
        assert streamed_lps == pytest.approx(unary_lps, abs=1e-4)
        wrong = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
