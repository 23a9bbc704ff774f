"""Joining a cluster started with `ray start --head` (token auth on), sharing it, and leaving it.

One head (2 CPUs), three gateway hosts that joined as 0-CPU nodes (what deploy/ray-join.sh does)
and one bare host, each host its own network namespace. Gateways are `rollmesh serve gateway`
processes given only what Ray documents for clients (the token file, via RAY_AUTH_TOKEN_PATH) and
serve fake-engine replicas (the test is about the cluster, not vLLM).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multinode.hosts import gateway_command
from tests.multinode.hosts import gateway_env
from tests.multinode.hosts import generate
from tests.multinode.hosts import run_gateway
from tests.multinode.hosts import stop
from tests.multinode.netns import NetnsLab
from tests.multinode.raylab import GCS_PORT
from tests.multinode.raylab import RayLab

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ray(lab: NetnsLab, workdir: Path) -> Iterator[RayLab]:
    cluster = RayLab(lab, workdir)
    cluster.start_head(lab.add_host("head"), cpus=2)
    for name in ("gwa", "gwb", "gwc"):
        cluster.start_node(lab.add_host(name), cpus=0)
    lab.add_host("bare")
    cluster.wait_alive({h.ip for name, h in lab.hosts.items() if name != "bare"})
    yield cluster


def _apps(ray: RayLab) -> set[str]:
    return set(ray.probe("apps"))


def _wait_apps(ray: RayLab, ok: Callable[[set[str]], bool], what: str, timeout_s: float = 60) -> set[str]:
    deadline = time.monotonic() + timeout_s
    apps: set[str] = set()
    while time.monotonic() < deadline:
        apps = _apps(ray)
        if ok(apps):
            return apps
        time.sleep(1.0)
    raise AssertionError(f"{what}: never true; Serve applications on the cluster: {sorted(apps)}")


def _expect_one_line_failure(result: subprocess.CompletedProcess[str], reason: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"[{reason}]" in errors[0], result.stderr[-3000:]
    return errors[0]


def test_gateway_joins_with_the_token_file_only(lab: NetnsLab, ray: RayLab) -> None:
    host = lab.hosts["gwa"]
    env = gateway_env(host, ray)
    assert "RAY_AUTH_MODE" not in env and "RAY_AUTH_TOKEN_PATH" in env
    with run_gateway(host, env) as gw:
        reply = generate(gw.address, "What is 20 + 22?", seed=1)
        assert reply.finish_reason == "stop" and reply.replica_id
        assert reply.message.content.startswith("The answer is ")
        apps = _apps(ray)
        assert any(a.startswith("rollmesh-tiny-arith-") for a in apps), apps
    # A clean stop removes this gateway's application and nothing else.
    _wait_apps(ray, lambda a: not any(x.startswith("rollmesh-tiny-arith-") for x in a), "app deleted")
    assert ray.probe("controller") is True, "Serve's controller must outlive a gateway's stop"


def test_two_gateways_share_the_cluster_and_one_stops(lab: NetnsLab, ray: RayLab) -> None:
    named = f"team-b-{uuid.uuid4().hex[:4]}"
    a_host, b_host = lab.hosts["gwa"], lab.hosts["gwb"]
    with (
        run_gateway(a_host, gateway_env(a_host, ray)) as gw_a,
        run_gateway(b_host, gateway_env(b_host, ray, ROLLMESH_SERVE_APP_NAME=named)) as gw_b,
    ):
        apps = _apps(ray)
        a_apps = {x for x in apps if x.startswith("rollmesh-tiny-arith-")}
        assert named in apps and len(a_apps) == 1, apps
        replica_a = generate(gw_a.address, "What is 1 + 2?", session="a").replica_id
        replica_b = generate(gw_b.address, "What is 1 + 2?", session="b").replica_id
        assert replica_a != replica_b  # each gateway has its own replicas
        assert set(ray.replica_nodes(named)) == {replica_b}

        # A third gateway asking for B's name is refused in one line; B is untouched.
        c_host = lab.hosts["gwc"]
        taken = subprocess.run(
            gateway_command(c_host),
            env=gateway_env(c_host, ray, ROLLMESH_SERVE_APP_NAME=named),
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        _expect_one_line_failure(taken, "SERVE_APP_EXISTS")
        assert set(ray.replica_nodes(named)) == {replica_b}

        assert stop(gw_a) == 0
        remaining = _wait_apps(ray, lambda a: not (a & a_apps), "A's application deleted")
        assert named in remaining
        assert ray.probe("controller") is True
        for i in range(5):
            reply = generate(gw_b.address, f"What is {i} + 40?", session="b")
            assert reply.replica_id == replica_b and reply.finish_reason == "stop"


def test_join_errors_are_one_line(lab: NetnsLab, ray: RayLab) -> None:
    host = lab.hosts["gwc"]
    no_token = gateway_env(host, ray)
    del no_token["RAY_AUTH_TOKEN_PATH"]  # and HOME has no ~/.ray/auth_token
    result = subprocess.run(
        gateway_command(host), env=no_token, capture_output=True, text=True, timeout=240, check=False
    )
    line = _expect_one_line_failure(result, "RAY_AUTH_FAILED")
    assert ray.address in line and "RAY_AUTH_TOKEN_PATH" in line

    nowhere = gateway_env(host, ray, ROLLMESH_RAY_ADDRESS=f"{lab.subnet}.250:{GCS_PORT}")
    started = time.monotonic()
    result = subprocess.run(
        gateway_command(host), env=nowhere, capture_output=True, text=True, timeout=240, check=False
    )
    line = _expect_one_line_failure(result, "RAY_CLUSTER_UNREACHABLE")
    assert f"{lab.subnet}.250:{GCS_PORT}" in line
    assert time.monotonic() - started < 120

    # A host that is not a Ray node: Ray looks for a local raylet (RAY_gcs_server_request_timeout_seconds
    # shortens its 60 s search), then the gateway says what to run there.
    bare = lab.hosts["bare"]
    result = subprocess.run(
        gateway_command(bare),
        env=gateway_env(bare, ray, RAY_gcs_server_request_timeout_seconds="10"),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    line = _expect_one_line_failure(result, "RAY_NOT_A_NODE")
    assert f"ray start --address={ray.address}" in line


def test_default_token_file_in_home(lab: NetnsLab, ray: RayLab, tmp_path: Path) -> None:
    """The token where `ray start` users have it (~/.ray/auth_token) is found too."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(ray.token_file.read_text())
    host = lab.hosts["gwc"]
    env = gateway_env(host, ray, HOME=str(home))
    del env["RAY_AUTH_TOKEN_PATH"]
    with run_gateway(host, env) as gw:
        assert generate(gw.address, "What is 3 + 4?").finish_reason == "stop"
