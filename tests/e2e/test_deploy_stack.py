"""The container stack as users meet it: `docker compose up -d --wait` on deploy/docker-compose.yml,
every service SERVING through its published port, a small job run inside the stack, its rows on
the `runs` volume, and `down -v`.

Needs a reachable Docker daemon with the compose plugin (skipped otherwise, with that reason). The
CPU image's torch comes from the PyTorch CPU wheel index: export PIP_EXTRA="--extra-index-url ..."
before running it on a machine whose pip does not already find it. The first build and the vLLM
replica's start on CPU take many minutes, hence the long timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from rollmesh.mesh.config import DEFAULT_PORTS, OPENAI_HTTP_PORT
from tests.procs import REPO, grpcurl, health_serving

COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
UP_TIMEOUT_S = 3600
# The job: the arithmetic benchmark on the shipped tiny model, a few tasks, run from inside the
# scheduler container against the stack's addresses (ROLLMESH_*_ADDR are set there).
JOB = "rollmesh jobs submit --benchmark arithmetic --limit 4 --num-repeats 2 --wait".split()


def docker_unavailable() -> str | None:
    """Why the stack cannot run here (None when it can): no docker CLI, no daemon, no compose."""
    if shutil.which("docker") is None:
        return "no Docker daemon reachable (docker info failed: the docker CLI is not installed)"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "no Docker daemon reachable (docker info failed: no answer in 30s)"
    if info.returncode != 0:
        lines = (info.stderr or info.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit code {info.returncode}"
        return f"no Docker daemon reachable (docker info failed: {detail})"
    compose = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, timeout=30, check=False
    )
    if compose.returncode != 0:
        return (
            f"the docker compose plugin is not available (docker compose version: {compose.stderr.strip()})"
        )
    return None


_REASON = docker_unavailable()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
    pytest.mark.timeout(UP_TIMEOUT_S + 600),
]


@dataclass
class Stack:
    project: str
    env: dict[str, str]

    def compose(
        self, *args: str, timeout_s: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = ["docker", "compose", "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        res = subprocess.run(
            cmd, capture_output=True, text=True, env=self.env, timeout=timeout_s, check=False
        )
        if check and res.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        return res

    def exec(
        self, service: str, argv: Sequence[str], timeout_s: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return self.compose("exec", "-T", service, *argv, timeout_s=timeout_s, check=False)

    def published(self, service: str, port: int) -> str:
        """host:port a container port is published on (the stack publishes on free host ports)."""
        out = self.compose("port", service, str(port)).stdout.strip().splitlines()
        assert out, f"{service}:{port} is not published"
        return out[0].replace("0.0.0.0:", "127.0.0.1:")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    project = f"rollmesh-e2e-{uuid.uuid4().hex[:8]}"
    # Empty host ports: publish on free ports, so the test never collides with a local mesh.
    ports = {
        "REGISTRY_PORT": "",
        "VERIFIER_PORT": "",
        "GATEWAY_PORT": "",
        "SCHEDULER_PORT": "",
        "OPENAI_HTTP_PORT": "",
        "RAY_DASHBOARD_PORT": "",
    }
    env = {**os.environ, **ports, "COMPOSE_PROJECT_NAME": project}
    env.pop("ROLLMESH_API_KEY", None)
    s = Stack(project, env)
    try:
        up = s.compose(
            "up",
            "-d",
            "--build",
            "--wait",
            "--wait-timeout",
            str(UP_TIMEOUT_S),
            timeout_s=UP_TIMEOUT_S + 300,
            check=False,
        )
        if up.returncode != 0:
            logs = s.compose("logs", "--no-color", "--tail", "200", check=False).stdout
            raise AssertionError(f"docker compose up failed ({up.returncode}):\n{up.stderr}\n{logs}")
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout_s=300, check=False)


def test_every_service_is_healthy_and_serving_through_its_published_port(stack: Stack) -> None:
    ps = stack.compose("ps", "--format", "json").stdout
    rows = [json.loads(line) for line in ps.splitlines() if line.strip()]
    rows = rows[0] if len(rows) == 1 and isinstance(rows[0], list) else rows
    health = {r["Service"]: r.get("Health", "") for r in rows}
    assert {"ray-head", *DEFAULT_PORTS} <= health.keys(), health
    assert all(h == "healthy" for h in health.values()), health
    for service, port in DEFAULT_PORTS.items():
        address = stack.published(service, port)
        deadline = time.monotonic() + 30
        while not health_serving(address):
            assert time.monotonic() < deadline, f"{service} at {address} is not SERVING"
            time.sleep(0.5)
    listed = grpcurl("-plaintext", stack.published("scheduler", DEFAULT_PORTS["scheduler"]), "list")
    assert listed.returncode == 0, listed.stderr
    assert "rollmesh.v1.RolloutScheduler" in listed.stdout.split()
    assert stack.published("gateway", OPENAI_HTTP_PORT)


def test_a_small_job_runs_in_the_stack_and_lands_on_the_runs_volume(stack: Stack) -> None:
    job = stack.exec("scheduler", JOB, timeout_s=1800)
    assert job.returncode == 0, f"{job.stdout}\n{job.stderr}"
    found = stack.exec("scheduler", ["find", "/srv/runs", "-name", "rollouts.jsonl"])
    assert found.returncode == 0, found.stderr
    files = found.stdout.split()
    assert files, "no rollouts.jsonl on the runs volume"
    rows = [json.loads(line) for line in stack.exec("scheduler", ["cat", files[0]]).stdout.splitlines()]
    assert len(rows) == 4 * 2
    for row in rows:
        assert "responses_create_params" in row and "expected_answer" in row
        assert 0.0 <= float(row["reward"]) <= 1.0
    agg = stack.exec("scheduler", ["rollmesh", "aggregate", os.path.dirname(files[0]), "--json"])
    assert agg.returncode == 0, agg.stderr
    metrics = json.loads(agg.stdout)
    assert metrics["num_rollouts"] == 8 and metrics["num_failures"] == 0
