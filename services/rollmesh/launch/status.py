"""`rollmesh status`: each service's address, health and a one-line summary (replicas for the
gateway, environments for the verifier, jobs for the scheduler, roots for the registry).

A service is `ok` only when it answers health with SERVING *and* its summary could be read: a
service that is up but refuses us (UNAUTHENTICATED: no or a wrong --api-key) is not usable, so
`rollmesh status` exits non-zero for it too and says why in `detail`."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from rollmesh_client import Client
from rollmesh_client import RollmeshClientError
from rollmesh_client._channel import aio_channel


@dataclass
class ServiceStatus:
    service: str
    address: str
    health: str  # SERVING, NOT_SERVING, UNREACHABLE ...
    detail: str = ""
    replicas: list[dict[str, object]] = field(default_factory=list)
    readable: bool = True  # False when health answered but the summary RPC failed

    @property
    def ok(self) -> bool:
        return self.health == "SERVING" and self.readable

    def to_json(self) -> dict[str, object]:
        """`rollmesh status --json`'s entry: the fields but `readable`, and `ok`."""
        data = asdict(self) | {"ok": self.ok}
        del data["readable"]
        return data


async def _health(address: str, api_key: str | None, timeout_s: float) -> str:
    channel = aio_channel(address, api_key=api_key)
    try:
        resp = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=timeout_s
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
    except grpc.aio.AioRpcError as exc:
        return (
            "UNREACHABLE"
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            else exc.code().name
        )
    finally:
        await channel.close()


async def _detail(c: Client, st: ServiceStatus) -> None:
    if st.service == "registry":
        roots = await c.registry.roots()
        st.detail = f"{len(roots.roots)} roots"
    elif st.service == "verifier":
        envs = [e async for e in c.verifier.environments()]
        parts = [f"{len(envs)} environments"]
        parts += [
            f"{e.name} sandbox: {e.sandbox}" + (" (UNSAFE opt-in)" if e.sandbox == "unsafe-process" else "")
            for e in envs
            if e.sandbox
        ]
        # Container tasks: the provider's live machines, from the environment's summary.
        parts += [e.description for e in envs if e.sandbox.startswith("container:")]
        parts += [f"broken {b.name}: {b.error[:160]}" for b in (await c.verifier.list(page_size=1)).broken]
        st.detail = "; ".join(parts)
    elif st.service == "gateway":
        models = [m async for m in c.gateway.models()]
        parts = []
        for m in models:
            healthy = sum(1 for r in m.replicas if r.healthy)
            parts.append(f"{m.name} ({m.backend}, {healthy}/{len(m.replicas)} replicas healthy)")
            st.replicas += [
                {
                    "model": m.name,
                    "replica_id": r.replica_id,
                    "healthy": r.healthy,
                    "in_flight": r.in_flight,
                    "weights_id": r.weights_id,
                    "policy_version": r.policy_version,
                }
                for r in m.replicas
            ]
        st.detail = "; ".join(parts)
    elif st.service == "scheduler":
        jobs = [j async for j in c.scheduler.jobs()]
        st.detail = f"{len(jobs)} jobs"


async def mesh_status(
    addresses: dict[str, str], *, api_key: str | None = None, timeout_s: float = 3.0
) -> list[ServiceStatus]:
    """Health and summary of each service in `addresses` (service -> address), in parallel; never
    raises for a down service."""
    async with await Client.connect(**addresses, api_key=api_key, timeout_s=timeout_s) as c:

        async def one(service: str) -> ServiceStatus:
            st = ServiceStatus(
                service, addresses[service], await _health(addresses[service], api_key, timeout_s)
            )
            if st.ok:
                try:
                    await _detail(c, st)
                except RollmeshClientError as exc:
                    st.readable = False
                    st.detail = f"cannot read it: {exc}"
            return st

        return list(await asyncio.gather(*(one(s) for s in addresses)))
