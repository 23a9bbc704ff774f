"""Replicas Serve starts after a weight update serve the CURRENT weights, and a replica on other
weights never answers: a Gateway over a local Ray Serve with 2 fake-engine replicas (the production
serving path minus vLLM: placement, routing, health checks, replacement; weights_record.py).
  - after UpdateWeights every replica reports the new weights id, folder and policy version;
  - a replica killed with ray.kill (this application's only) is replaced by Serve, and the
    replacement reports the new weights before it answers; its answers carry the new version;
  - a replica made to serve other weights (a load pinned to it, bypassing the gateway) answers
    nothing: requests go to the other replica, and Serve replaces it after its health checks fail.
The same path with vLLM replicas (real weights, greedy outputs) is test_update_weights_real.py.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from rollmesh.gateway import Gateway
from rollmesh.gateway import GenerateInput
from rollmesh.gateway import GenerateResult
from rollmesh.gateway import Message
from rollmesh.gateway import SamplingInput
from rollmesh.serving.backend import RayServeBackend
from tests.serving_replicas import SHIPPED
from tests.serving_replicas import kill_replica
from tests.serving_replicas import tiny_serving_config
from tests.serving_replicas import until_answered_by
from tests.serving_replicas import wait_replaced

DEADLINE_S = 900.0  # a local Ray start plus two replacements: about a minute idle, several under load

pytestmark = [pytest.mark.slow, pytest.mark.timeout(DEADLINE_S + 120)]


def ask(i: int, *, session: bool) -> GenerateInput:
    return GenerateInput(
        messages=(Message("user", f"What is {i} + 1?"),),
        sampling=SamplingInput(temperature=0.0, max_tokens=16),
        # A new session: the router picks the least-loaded replica. None: a micro-batch (batching.py).
        session_id=uuid.uuid4().hex if session else "",
    )


async def answers(gateway: Gateway, n: int, *, session: bool = True) -> list[GenerateResult]:
    return list(await asyncio.gather(*(gateway.generate(ask(i, session=session)) for i in range(n))))


async def test_replacement_replicas_serve_current_weights_and_stale_ones_never_answer(tmp_path: Path) -> None:
    async with asyncio.timeout(DEADLINE_S):
        await _scenario(tmp_path)


async def _scenario(tmp_path: Path) -> None:
    from ray import serve

    config = tiny_serving_config(engine="fake", replica_cpus=0.1, startup_timeout_s=DEADLINE_S)
    backend = RayServeBackend(config)
    gateway = Gateway([backend])
    await gateway.start()
    try:
        new = Path(shutil.copytree(SHIPPED, tmp_path / "step1"))
        update = await gateway.update_weights("", new)
        current = backend.current_weights
        assert (update.policy_version, current.weights_path, current.policy_version) == ("1", str(new), "1")

        async def weights_of(replica_id: str) -> tuple[str, str, str]:
            stats = await backend.replica_stats(replica_id)
            assert stats is not None, f"replica {replica_id} does not answer"
            return stats["weights_id"], stats["weights_path"], stats["policy_version"]

        expected = (current.weights_id, str(new), "1")
        before = await backend.cluster.replica_ids()
        assert [await weights_of(r) for r in before] == [expected, expected]

        # A replica killed after the update: its replacement starts on the new weights.
        await kill_replica(backend, before[0])
        replacement = await wait_replaced(backend, before, before[0], timeout_s=DEADLINE_S / 2)
        assert await weights_of(replacement) == expected

        async def ask() -> list[GenerateResult]:
            results = await answers(gateway, 4)
            assert {r.policy_version for r in results} == {"1"}
            return results

        await until_answered_by(replacement, ask)
        ids = await backend.cluster.replica_ids()
        listed = {
            r.replica_id: (r.weights_id, r.policy_version) for r in (await gateway.list_models())[0].replicas
        }
        assert listed == dict.fromkeys(ids, (current.weights_id, "1")), (
            "ListModels shows what each replica serves"
        )

        # A replica serving other weights (loaded behind the gateway's back) never answers.
        rogue, healthy = replacement, next(r for r in ids if r != replacement)
        handle: Any = serve.get_deployment_handle(config.deployment_name, app_name=config.app_name)
        await handle.load_weights.remote(
            weights_path=str(SHIPPED), weights_id="rogue", policy_version="0", pin_replica=rogue
        )
        assert (await weights_of(rogue))[0] == "rogue"
        with capture_logs() as logs:
            results = await answers(gateway, 12) + await answers(gateway, 12, session=False)
        assert {(r.replica_id, r.policy_version) for r in results} == {(healthy, "1")}
        refused = [e for e in logs if e["event"] == "replica_serves_stale_weights"]
        assert refused and {e["replica_id"] for e in refused} == {rogue}, "the router never tried the rogue"

        # Its health check fails: Serve replaces it with a replica on the current weights.
        await wait_replaced(backend, ids, rogue, timeout_s=DEADLINE_S / 2)
        ids = await backend.cluster.replica_ids()
        assert [await weights_of(r) for r in ids] == [expected, expected]
        models = await gateway.list_models()
        live = [r for r in models[0].replicas if r.healthy]  # the rogue may still be listed, down (sessions)
        assert {(r.replica_id, r.weights_id, r.policy_version) for r in live} == {
            (r, current.weights_id, "1") for r in ids
        }
    finally:
        await gateway.shutdown()
