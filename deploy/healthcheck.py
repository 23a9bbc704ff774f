"""Container healthcheck: exit 0 when the gRPC server at HOST:PORT answers SERVING, else 1.

    python /opt/rollmesh/healthcheck.py 127.0.0.1:50051 [--service rollmesh.v1.ArtifactRegistry]

It asks the standard `grpc.health.v1.Health/Check`, which the mesh exempts from the API key, so a
stack started with `ROLLMESH_API_KEY` is checked the same way. A draining server (NOT_SERVING after
SIGTERM) is unhealthy. One line on stderr says why it failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc


def check(address: str, service: str = "", timeout_s: float = 3.0) -> tuple[bool, str]:
    """(healthy, what was seen) for one Health/Check call with a deadline."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            name = code.name if code is not None else "ERROR"
            return False, f"{address}: {name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return resp.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="gRPC health check for a rollmesh container.")
    parser.add_argument("address", help="host:port of the server, e.g. 127.0.0.1:50051")
    parser.add_argument("--service", default="", help="Service name to check (default: the server).")
    parser.add_argument("--timeout", type=float, default=3.0, help="Deadline of the call in seconds.")
    args = parser.parse_args(argv)
    healthy, seen = check(args.address, args.service, args.timeout)
    if not healthy:
        sys.stderr.write(f"unhealthy: {seen}\n")
    return 0 if healthy else 1


if __name__ == "__main__":
    raise SystemExit(main())
