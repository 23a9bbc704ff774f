"""Jobs through replicas spread over hosts: placement, sticky sessions, sharded schedulers on two
hosts, and a host lost mid-job.

Hosts (each a network namespace with its own address): a Ray head and two Ray workers with 1 CPU
each (where the replicas go), the gateway's host (a 0-CPU Ray node), and two scheduler hosts (a
verifier and a scheduler each, no Ray). The gateway serves 3 fake-engine replicas (the tests are
about placement and failover, not vLLM) with `ROLLMESH_REPLICAS_PER_NODE=1`: 0.5 CPU each would
let two share a node, so the spread is the setting's doing. The host-loss test runs last: it kills
a worker host and brings it back.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollmesh_client import SyncClient
from rollmesh_client.v1 import scheduler_pb2 as pb
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.exactly_once import read_keys
from tests.fakes import Rows
from tests.multinode.hosts import gateway_env
from tests.multinode.hosts import generate
from tests.multinode.hosts import run_gateway
from tests.multinode.netns import Host
from tests.multinode.netns import NetnsLab
from tests.multinode.raylab import RayLab
from tests.procs import ROLLMESH
from tests.procs import ServerProc
from tests.procs import spawn_server

pytestmark = pytest.mark.timeout(300)

APP = "rollmesh-multinode"
REPLICAS = 3
REPEATS = 4


@dataclass
class Mesh:
    ray: RayLab
    gateway: ServerProc
    schedulers: dict[str, ServerProc]  # host name -> scheduler
    out: Path


@contextmanager
def _scheduler_on(host: Host, ray: RayLab, gateway: str, out: Path) -> Iterator[ServerProc]:
    env = ray.base_env() | {"ROLLMESH_BIND_HOST": host.ip, "ROLLMESH_VERIFIER_WORKERS": "1"}
    verifier_cmd = host.command([str(ROLLMESH), "serve", "verifier", "--port", "0"])
    with spawn_server(verifier_cmd, env=env) as verifier:
        scheduler_env = env | {"ROLLMESH_GATEWAY_ADDR": gateway, "ROLLMESH_VERIFIER_ADDR": verifier.address}
        cmd = host.command([str(ROLLMESH), "serve", "scheduler", "--port", "0", "--output-dir", str(out)])
        with spawn_server(cmd, env=scheduler_env) as scheduler:
            yield scheduler


@pytest.fixture(scope="module")
def mesh(lab: NetnsLab, workdir: Path) -> Iterator[Mesh]:
    ray = RayLab(lab, workdir)
    ray.start_head(lab.add_host("head"), cpus=1)
    for name in ("w1", "w2"):
        ray.start_node(lab.add_host(name), cpus=1)
    gw = lab.add_host("gw")
    ray.start_node(gw, cpus=0)
    for name in ("s1", "s2"):
        lab.add_host(name)
    ray.wait_alive({lab.hosts[n].ip for n in ("head", "w1", "w2", "gw")})
    env = gateway_env(
        gw,
        ray,
        ROLLMESH_SERVE_APP_NAME=APP,
        ROLLMESH_REPLICAS=str(REPLICAS),
        ROLLMESH_REPLICAS_PER_NODE="1",
        ROLLMESH_FAKE_TOKEN_LATENCY_S="0.03",
    )
    out = workdir / "runs"
    with ExitStack() as stack:
        gateway = stack.enter_context(run_gateway(gw, env))
        schedulers = {
            name: stack.enter_context(_scheduler_on(lab.hosts[name], ray, gateway.address, out))
            for name in ("s1", "s2")
        }
        yield Mesh(ray, gateway, schedulers, out)


def _worker_ips(lab: NetnsLab) -> set[str]:
    return {lab.hosts[n].ip for n in ("head", "w1", "w2")}


def _spec(data: Path, out: Path, *, shard: tuple[int, int] = (0, 0), concurrency: int = 12) -> pb.JobSpec:
    return pb.JobSpec(
        dataset=str(data),
        environment="arithmetic",
        num_repeats=REPEATS,
        concurrency=concurrency,
        output_dir=str(out),
        shard=pb.Shard(index=shard[0], count=shard[1]),
        retry=pb.RetryPolicy(max_attempts=4, unavailable_budget_s=120),
    )


def _aggregate(*files: Path) -> dict[str, Any]:
    result = subprocess.run(
        [str(ROLLMESH), "aggregate", "--json", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    data: dict[str, Any] = json.loads(result.stdout)
    data.pop("job_id", None)
    data.pop("timing", None)  # where each run's time went: measured per run, not a result of the rollouts
    return data


def test_replicas_spread_one_per_node_and_sessions_stick(lab: NetnsLab, mesh: Mesh) -> None:
    placed = mesh.ray.replica_nodes(APP)
    assert len(placed) == REPLICAS and set(placed.values()) == _worker_ips(lab), placed

    # New sessions go to the least-loaded replica: one at a time, they take turns over all three.
    homes = {
        f"s{i}": generate(mesh.gateway.address, f"What is {i} + 1?", session=f"s{i}").replica_id
        for i in range(6)
    }
    assert set(homes.values()) == set(placed), homes
    assert all(list(homes.values()).count(r) == 2 for r in placed), homes
    for turn in range(3):
        for session, home in homes.items():
            reply = generate(mesh.gateway.address, f"What is {turn} + 7?", session=session, seed=turn)
            assert reply.replica_id == home, f"{session} left {home} on turn {turn}"


def test_two_schedulers_on_two_hosts_aggregate_like_one_run(mesh: Mesh, tmp_path: Path) -> None:
    data = Rows.arithmetic(30).write(tmp_path / "arith.jsonl")
    jobs: dict[str, pb.Job] = {}
    with (
        SyncClient.connect(scheduler=mesh.schedulers["s1"].address) as c1,
        SyncClient.connect(scheduler=mesh.schedulers["s2"].address) as c2,
    ):
        handles = {
            "whole": c1.scheduler.submit(_spec(data, mesh.out)),
            "shard0": c1.scheduler.submit(_spec(data, mesh.out, shard=(0, 2))),
            "shard1": c2.scheduler.submit(_spec(data, mesh.out, shard=(1, 2))),
        }
        for name, handle in handles.items():
            jobs[name] = handle.result(poll_s=0.2, timeout_s=240)
    for name, job in jobs.items():
        assert job.state == pb.JOB_STATE_SUCCEEDED, (name, job.error)
    check_exactly_once(mesh.out / jobs["whole"].job_id, expected_keys(30, REPEATS), job=jobs["whole"])
    shard_keys = [set(read_keys(mesh.out / jobs[s].job_id / "rollouts.jsonl")) for s in ("shard0", "shard1")]
    assert not shard_keys[0] & shard_keys[1] and shard_keys[0] | shard_keys[1] == expected_keys(30, REPEATS)

    whole = _aggregate(mesh.out / jobs["whole"].job_id / "rollouts.jsonl")
    sharded = _aggregate(*(mesh.out / jobs[s].job_id / "rollouts.jsonl" for s in ("shard0", "shard1")))
    assert sharded == whole
    assert 0.0 < whole["mean_reward"] < 1.0  # the fake engine misses some: the metrics are not trivial


def test_host_lost_mid_job_completes_exactly_once_and_the_replica_returns(
    lab: NetnsLab, mesh: Mesh, tmp_path: Path
) -> None:
    tasks = 60
    data = Rows.arithmetic(tasks).write(tmp_path / "arith.jsonl")
    placed = mesh.ray.replica_nodes(APP)
    victim_host = lab.hosts["w2"]
    victim = next(r for r, ip in placed.items() if ip == victim_host.ip)
    with SyncClient.connect(scheduler=mesh.schedulers["s1"].address) as c:
        handle = c.scheduler.submit(_spec(data, mesh.out))
        deadline = time.monotonic() + 120
        while handle.get().progress.done < 40:  # some done, most still to go
            assert time.monotonic() < deadline, "job made no progress"
            time.sleep(0.2)
        lab.kill_host(victim_host)  # the host loses power: raylet, replica, everything on it
        final: pb.Job = handle.result(poll_s=0.2, timeout_s=240)

    assert final.state == pb.JOB_STATE_SUCCEEDED, final.error
    assert final.progress.failed == 0
    check_exactly_once(mesh.out / final.job_id, expected_keys(tasks, REPEATS), job=final)
    # The victim was serving when it died; the job lost nothing, so what it had in flight finished
    # on the survivors: retried by the gateway on another replica (before any token), or by the
    # scheduler (the gateway answered UNAVAILABLE).
    failover = [ln for ln in mesh.gateway.log().splitlines() if "replica_failed_during_request" in ln]
    assert any(victim in ln for ln in failover) or final.progress.retries > 0, (victim, final.progress)

    # Serve cannot place the lost replica elsewhere (one per node); when the host returns, it does.
    mesh.ray.wait_alive(_worker_ips(lab) - {victim_host.ip} | {lab.hosts["gw"].ip}, timeout_s=60)
    assert len(mesh.ray.replica_nodes(APP)) == REPLICAS - 1
    mesh.ray.start_node(victim_host, cpus=1)
    deadline = time.monotonic() + 180
    while True:
        now = mesh.ray.replica_nodes(APP)
        if len(now) == REPLICAS and set(now.values()) == _worker_ips(lab):
            break
        assert time.monotonic() < deadline, f"replicas not restored: {now}"
        time.sleep(2.0)
    assert victim not in now
    reply = generate(mesh.gateway.address, "What is 5 + 5?", session="after")
    assert reply.finish_reason == "stop"
