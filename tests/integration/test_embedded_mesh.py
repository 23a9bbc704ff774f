"""The embedded mesh (`rollmesh run` without --scheduler) wires its services to each other, not to
the default ports: the math judge reaches this mesh's gateway with this mesh's key, whatever
ROLLMESH_GATEWAY_ADDR says; and the start-up line names the backend actually started."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.launch import embedded_mesh
from rollmesh.launch.embedded import backend_phase
from rollmesh.verifier.config import VerifierConfig
from rollmesh_client import Client
from rollmesh_client import UnavailableError

KEY = "embedded-key"


async def test_the_math_judge_calls_the_embedded_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLMESH_VERIFIER_MATH_JUDGE", "1")
    monkeypatch.setenv("ROLLMESH_GATEWAY_ADDR", "127.0.0.1:1")  # nothing listens there
    monkeypatch.delenv("ROLLMESH_API_KEY", raising=False)
    spec = ModelSpec(name="fake", backend="fake", model="fake")
    cfg = GatewayConfig(models=(spec,), default_model="fake", http_port=-1)
    async with embedded_mesh(cfg, output_dir=str(tmp_path / "runs"), api_key=KEY) as mesh:
        async with await Client.connect(**mesh.addresses, api_key=KEY, timeout_s=120) as c:
            task = {"expected_answer": "4", "responses_create_params": {"input": "Solve 2x + 3 = 11."}}
            with pytest.raises(UnavailableError) as judged:
                await c.verifier.verify("math", task, "x equals four")
    # The fake model echoes the judge's prompt: an answer came back from this mesh's gateway (an
    # unparseable verdict, so no reward: JUDGE_FAILED), not UNAVAILABLE from 127.0.0.1:1 nor
    # UNAUTHENTICATED for a missing key.
    assert judged.value.reason == "JUDGE_FAILED", judged.value
    assert "unparseable verdict" in str(judged.value), judged.value


def test_the_start_up_line_names_the_backend() -> None:
    remote = ModelSpec(name="m", backend="openai", model="m", base_url="http://127.0.0.1:9/v1")
    line = backend_phase(GatewayConfig(models=(remote,), default_model="m"))
    assert "http://127.0.0.1:9/v1" in line and "Ray" not in line and "vLLM" not in line
    local = ModelSpec(name="tiny-arith", backend="ray-serve", model="tiny-arith")
    assert "Ray Serve + vLLM" in backend_phase(GatewayConfig(models=(local,), default_model="tiny-arith"))


def test_the_verifier_default_gateway_address_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROLLMESH_GATEWAY_ADDR", "10.1.2.3:6000")
    assert VerifierConfig().gateway_addr == "10.1.2.3:6000"
    assert VerifierConfig.from_env(environ={}).gateway_addr == "127.0.0.1:50053"
