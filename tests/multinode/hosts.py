"""Running rollmesh on the lab's hosts: a gateway process on a host, and a gRPC call to it.

with run_gateway(host, ray_lab, env={...}) as gw:     # `rollmesh serve gateway` inside `host`
    reply = generate(gw.address, "What is 2 + 3?", session="s1")
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager

import grpc

from rollmesh_client.v1 import common_pb2
from rollmesh_client.v1 import gateway_pb2
from rollmesh_client.v1 import gateway_pb2_grpc
from tests.multinode.netns import Host
from tests.multinode.raylab import RayLab
from tests.procs import ROLLMESH
from tests.procs import ServerProc
from tests.procs import spawn_server

GATEWAY_STARTUP_S = 240.0


def gateway_env(host: Host, ray: RayLab, **extra: str) -> dict[str, str]:
    """A gateway on `host` joining the lab's cluster with fake-engine replicas (0.5 CPU each)."""
    return ray.client_env() | {
        "ROLLMESH_RAY_ADDRESS": ray.address,
        "ROLLMESH_BIND_HOST": host.ip,
        "ROLLMESH_GATEWAY_BACKEND": "ray-serve",
        "ROLLMESH_SERVE_ENGINE": "fake",
        "ROLLMESH_REPLICA_CPUS": "0.5",
        "ROLLMESH_SERVE_STARTUP_TIMEOUT": "180",
        "ROLLMESH_GRACE_SECONDS": "2",
        **extra,
    }


def gateway_command(host: Host, *args: str) -> list[str]:
    return host.command([str(ROLLMESH), "serve", "gateway", "--port", "0", "--http-port", "-1", *args])


@contextmanager
def run_gateway(host: Host, env: Mapping[str, str], *args: str) -> Iterator[ServerProc]:
    with spawn_server(gateway_command(host, *args), env=env, timeout_s=GATEWAY_STARTUP_S) as server:
        yield server


def stop(server: ServerProc, *, timeout_s: float = 60) -> int:
    """SIGTERM the gateway (a clean shutdown) and wait for it; returns its exit code."""
    server.proc.terminate()
    try:
        return server.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        raise


def generate(
    address: str, question: str, *, session: str = "", seed: int = 0, timeout_s: float = 60
) -> gateway_pb2.GenerateResponse:
    with grpc.insecure_channel(address) as channel:
        stub = gateway_pb2_grpc.ModelGatewayStub(channel)
        reply: gateway_pb2.GenerateResponse = stub.Generate(
            gateway_pb2.GenerateRequest(
                messages=[common_pb2.ChatMessage(role="user", content=question)],
                session_id=session,
                sampling=common_pb2.SamplingParams(max_tokens=32, seed=seed),
            ),
            timeout=timeout_s,
        )
    return reply
