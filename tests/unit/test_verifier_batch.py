"""VerifyBatch's server side (`VerifierServicer.verify_batch`, as the stream handler and the embedded
mesh run it): bounded concurrency, completion order, per-item errors that do not end the stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import grpc

from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.multiplex import Item
from rollmesh.mesh.multiplex import run_multiplexed_batches
from rollmesh.verifier import Environment
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.loader import Discovery
from rollmesh.verifier.loader import Loaded
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh.verifier.workers import WorkerPool
from rollmesh_client.v1 import verifier_pb2 as pb


class Gate(Environment):
    """Waits for its task's gate; tracks how many verifies run at once."""

    running = 0
    peak = 0
    gates: ClassVar[dict[str, asyncio.Event]] = {}

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        cls = type(self)
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        try:
            await cls.gates[str(task.row["gate"])].wait()
        finally:
            cls.running -= 1
        return VerifyResult(float(task.row["gate"]))


async def verify_many(
    svc: VerifierService, calls: AsyncIterator[tuple[str, VerifyCall]]
) -> AsyncIterator[tuple[str, VerifyResult | RollmeshError]]:
    """The calls as VerifyBatch items run by `verify_batch()`'s method, one result at a time."""
    method = VerifierServicer(svc).verify_batch()

    async def items() -> AsyncIterator[Item[VerifyResult]]:
        async for item_id, call in calls:
            request = pb.VerifyRequest(environment=call.environment, task_json=call.task_json)
            item = method.item(pb.VerifyBatchRequest(id=item_id, request=request))
            assert item is not None
            yield item

    async for batch in run_multiplexed_batches(items(), limit=method.limit, what="verify"):
        for got in batch:
            yield got


def gate_service(concurrency: int, verify_timeout_s: float = 30.0) -> VerifierService:
    cfg = replace(VerifierConfig(), batch_concurrency=concurrency, verify_timeout_s=verify_timeout_s)
    from rollmesh.verifier.environment import EnvContext

    env = Gate(EnvContext("gate", Path("."), cfg, WorkerPool(1)))
    return VerifierService(cfg, Discovery({"gate": Loaded("gate", env, "test")}, {}))


async def test_completion_order_and_per_item_errors() -> None:
    svc = gate_service(4)
    Gate.gates = {str(i): asyncio.Event() for i in range(3)}

    async def calls() -> AsyncIterator[tuple[str, VerifyCall]]:
        for i in range(3):
            yield f"id{i}", VerifyCall("gate", json.dumps({"gate": i}), Response())
        yield "bad-json", VerifyCall("gate", "{not json", Response())
        yield "no-env", VerifyCall("nope", "{}", Response())

    out: list[tuple[str, float | str]] = []
    stream = verify_many(svc, calls())
    for _ in range(2):  # the two errors come first: nothing else has finished
        item_id, res = await anext(stream)
        assert isinstance(res, RollmeshError)
        out.append((item_id, res.reason))
    Gate.gates["2"].set()
    out.append((lambda r: (r[0], r[1].reward))(await anext(stream)))  # type: ignore[union-attr]
    Gate.gates["0"].set()
    Gate.gates["1"].set()
    async for item_id, res in stream:
        assert isinstance(res, VerifyResult)
        out.append((item_id, res.reward))
    assert out[:3] == [("bad-json", "BAD_TASK"), ("no-env", "ENVIRONMENT_NOT_FOUND"), ("id2", 2.0)]
    assert sorted(out[3:]) == [("id0", 0.0), ("id1", 1.0)]


async def test_concurrency_is_bounded_and_timeouts_are_items() -> None:
    svc = gate_service(3, verify_timeout_s=0.2)
    Gate.running = Gate.peak = 0
    Gate.gates = {"open": asyncio.Event(), "never": asyncio.Event()}
    Gate.gates["open"].set()

    async def calls() -> AsyncIterator[tuple[str, VerifyCall]]:
        yield "stuck", VerifyCall("gate", json.dumps({"gate": "never"}), Response())
        for i in range(20):
            yield str(i), VerifyCall("gate", json.dumps({"gate": "open"}), Response())

    results = [r async for r in verify_many(svc, calls())]
    assert len(results) == 21 and Gate.peak <= 3
    stuck = dict(results)["stuck"]
    assert isinstance(stuck, RollmeshError)
    assert stuck.code == grpc.StatusCode.DEADLINE_EXCEEDED and stuck.reason == "VERIFY_TIMEOUT"
