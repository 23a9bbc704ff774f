"""What the gateway and the verifier read off their live state at scrape time: generations waiting
at the pause gate and their queueing time; per environment whether it can serve, its bridged
server's restarts and its worker queue."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from prometheus_client import REGISTRY

from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import Message
from rollmesh.gateway import telemetry as gateway_telemetry
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier import telemetry as verifier_telemetry
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.loader import Broken
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.workers import WorkerPool


async def until(done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not done():  # noqa: ASYNC110 (a state read off other tasks' work: nothing to wait on)
            await asyncio.sleep(0.01)


def queued_count(model: str) -> float:
    labels = {"model": model}
    return REGISTRY.get_sample_value("rollmesh_gateway_queue_seconds_count", labels) or 0.0


async def test_a_paused_gateway_counts_waiting_generations_and_their_queueing_time() -> None:
    gw = Gateway([FakeBackend("queued-m")])
    await gw.start()
    before = queued_count("queued-m")
    gw.pause("queued-m")
    waiting = {n: v for n, labels, v in gateway_telemetry.samples(gw.live_models()) if n.endswith("_waiting")}
    assert waiting == {"rollmesh_gateway_generations_waiting": 0.0}
    job = asyncio.ensure_future(gw.generate(GenerateInput(messages=(Message("user", "hi"),))))

    def waiting_now() -> float:
        (m,) = [
            v
            for n, _, v in gateway_telemetry.samples(gw.live_models())
            if n == "rollmesh_gateway_generations_waiting"
        ]
        return m

    await until(lambda: waiting_now() == 1.0)
    assert queued_count("queued-m") == before  # observed when it passes the gate, not before
    gw.resume("queued-m")
    await job
    assert waiting_now() == 0.0
    assert queued_count("queued-m") == before + 1
    await gw.shutdown()


class Slow(Environment):
    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        await self.context.workers.call("time:sleep", float(task.row["s"]), timeout_s=60)
        return VerifyResult(1.0)


class Down(Slow):
    def problem(self) -> str:
        return "its server is down"

    def server_restarts(self) -> int:
        return 3


def live(svc: VerifierService) -> dict[tuple[str, str], float]:
    return {
        (n, labels.get("environment", "")): v for n, labels, v in verifier_telemetry.samples(svc.live_state())
    }


async def test_the_verifier_reports_each_environment_up_its_restarts_and_its_worker_queue(
    tmp_path: Path,
) -> None:
    cfg = replace(VerifierConfig(), verify_timeout_s=60.0)
    pool = WorkerPool(1, name="slow-workers")
    slow = Slow(EnvContext("slow", tmp_path, cfg, pool))
    down = Down(EnvContext("down", tmp_path, cfg, WorkerPool(1)))
    svc = VerifierService(
        cfg,
        Discovery(
            {"slow": Loaded("slow", slow, "test"), "down": Loaded("down", down, "test")},
            {"gone": Broken("gone", "test", "failed to import")},
        ),
    )
    first = live(svc)
    assert first[("rollmesh_verifier_environment_up", "slow")] == 1.0
    assert first[("rollmesh_verifier_environment_up", "down")] == 0.0
    assert first[("rollmesh_verifier_environment_up", "gone")] == 0.0
    assert first[("rollmesh_verifier_environment_server_restarts", "down")] == 3.0
    assert first[("rollmesh_verifier_environment_server_restarts", "slow")] == 0.0
    # One worker, three checks: one runs, two wait for it.
    calls = [asyncio.ensure_future(pool.call("time:sleep", 1.0, timeout_s=60)) for _ in range(3)]
    try:
        await until(
            lambda: (
                live(svc)[("rollmesh_verifier_worker_calls_running", "slow")] == 1.0
                and live(svc)[("rollmesh_verifier_worker_calls_waiting", "slow")] == 2.0
            )
        )
        await asyncio.gather(*calls)
        now = live(svc)
        assert now[("rollmesh_verifier_worker_calls_running", "slow")] == 0.0
        assert now[("rollmesh_verifier_worker_calls_waiting", "slow")] == 0.0
    finally:
        await pool.aclose()


async def test_every_replica_has_its_series_at_zero_and_its_health() -> None:
    """Per-replica series exist before and after a generation (they vanished at 0), with each
    replica's health as the backend reports it (`rollmesh status` said 1/1 healthy; metrics nothing)."""
    backend = FakeBackend("replicas-m", num_replicas=2)
    gw = Gateway([backend])
    await gw.start()

    def per_replica(name: str) -> dict[str, float]:
        return {
            labels["replica"]: v
            for n, labels, v in gateway_telemetry.samples(gw.live_models())
            if n == name and labels.get("model") == "replicas-m"
        }

    await until(lambda: len(per_replica("rollmesh_gateway_replica_up")) == 2)
    assert per_replica("rollmesh_gateway_replica_up") == dict.fromkeys(backend.replica_ids, 1.0)
    assert per_replica("rollmesh_gateway_replica_generations_in_flight") == dict.fromkeys(
        backend.replica_ids, 0
    )
    await gw.generate(GenerateInput(messages=(Message("user", "hi"),)))
    assert per_replica("rollmesh_gateway_replica_generations_in_flight") == dict.fromkeys(
        backend.replica_ids, 0
    )
    samples = {
        (s.name, s.labels.get("replica", "")): s.value
        for family in REGISTRY.collect()
        if family.name.startswith("rollmesh_gateway_replica")
        for s in family.samples
        if s.labels.get("model") == "replicas-m"
    }
    for replica in backend.replica_ids:
        assert samples[("rollmesh_gateway_replica_up", replica)] == 1.0
        assert samples[("rollmesh_gateway_replica_generations_in_flight", replica)] == 0.0
    await gw.shutdown()
