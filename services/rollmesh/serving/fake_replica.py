"""`FakeReplica`: a Serve replica with `VLLMReplica`'s interface and no model (engine "fake").

It runs the gateway's scripted `FakeBackend` engine inside a real Ray Serve replica, so everything
around the engine is the production path (Serve placement and health checks, the session-affinity
router, failover, abort, stats) at the cost of a few MB per replica instead of a vLLM engine. That is
what placement and node-failure tests, and demos of a cluster, need.

The script answers "What is A + B?" (also - and *) with "The answer is N.": right, except for
about one sampling seed in four, where it is off by one, so rewards vary across rollouts the way a
model's do. Output depends only on the prompt and the seed: any replica gives the same answer.
Tokens are `FakeTokenizer` ids (the gateway uses `fake_tokenizer()` for this engine).
`fake_token_latency_s` paces the tokens (a request then takes about that times its length).
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from rollmesh.gateway.backends.base import EngineChunk, EngineRequest, Sampling
from rollmesh.gateway.backends.fake import FakeBackend, FakeTokenizer
from rollmesh.serving.batching import BatchItem, BatchReport, merge_chunks, run_batch
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.weights_record import ReplicaWeights, WeightsRef, weights_stats

FAKE_MAX_MODEL_LEN = 4096
_EXPR = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")


def arithmetic_script(prompt_text: str, request: EngineRequest) -> str:
    """The answer to the last arithmetic expression asked by the user (see the module docstring)."""
    start = prompt_text.rfind("<|user|>")
    asked = _EXPR.findall(prompt_text[start:] if start >= 0 else prompt_text)
    if not asked:
        return "I only do arithmetic."
    a, op, b = asked[-1]
    x, y = int(a), int(b)
    answer = x + y if op == "+" else x - y if op == "-" else x * y
    if zlib.crc32(f"{prompt_text}|{request.sampling.seed}".encode()) % 4 == 0:
        answer += 1
    return f"The answer is {answer}."


def fake_tokenizer() -> tuple[FakeTokenizer, int]:
    """The gateway-side tokenizer and context length for `engine="fake"`."""
    return FakeTokenizer(), FAKE_MAX_MODEL_LEN


class FakeReplica:
    """Same keyword-only methods as `VLLMReplica` (the router reads the same routing hints)."""

    async def __init__(self, config: ServingConfig) -> None:  # type: ignore[misc]  # Serve awaits it
        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._engine = FakeBackend(
            config.name,
            script=arithmetic_script,
            max_model_len=FAKE_MAX_MODEL_LEN,
            token_latency_s=config.fake_token_latency_s,
        )
        self._running: set[str] = set()
        self._served = 0
        self._weights = ReplicaWeights(config.app_name, config.model_path, _pretend_load)
        await self._weights.startup(pending_timeout_s=config.startup_timeout_s)

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        session_id: str = "",
        avoid_replica: str = "",
        stream: bool = True,
    ) -> AsyncIterator[EngineChunk]:
        del avoid_replica
        request = EngineRequest(
            request_id=request_id,
            sampling=sampling,
            prompt_token_ids=tuple(prompt_token_ids),
            session_id=session_id,
            stream=stream,
        )
        self._running.add(request_id)
        weights_id = self._weights.serving.weights_id
        try:
            if stream:
                async for chunk in self._engine.generate(request):
                    yield dataclasses.replace(chunk, replica_id=self._replica_id, weights_id=weights_id)
                return
            yield EngineChunk(replica_id=self._replica_id, weights_id=weights_id)
            yield await self._whole(request)
        finally:
            self._running.discard(request_id)
            self._served += 1

    async def generate_batch(
        self, *, requests: list[BatchItem], batch_size: int = 0, avoid_replica: str = ""
    ) -> AsyncIterator[BatchReport]:
        del batch_size, avoid_replica
        async for report in run_batch(self._replica_id, requests, self._whole_item):
            yield report

    async def _whole_item(self, item: BatchItem) -> EngineChunk:
        request = EngineRequest(
            request_id=item.request_id,
            sampling=item.sampling,
            prompt_token_ids=tuple(item.prompt_token_ids),
            stream=False,
        )
        self._running.add(item.request_id)
        try:
            return await self._whole(request)
        finally:
            self._running.discard(item.request_id)
            self._served += 1

    async def _whole(self, request: EngineRequest) -> EngineChunk:
        chunks = [c async for c in self._engine.generate(request)] or [EngineChunk(finish_reason="stop")]
        whole = merge_chunks(chunks)
        return dataclasses.replace(
            whole, replica_id=self._replica_id, weights_id=self._weights.serving.weights_id
        )

    async def abort(self, *, request_id: str, pin_replica: str = "") -> bool:
        del pin_replica
        if request_id not in self._running:
            return False
        return await self._engine.abort(request_id)

    async def stats(self, *, pin_replica: str = "") -> dict[str, Any]:
        del pin_replica
        return {
            "replica_id": self._replica_id,
            "in_flight": len(self._running),
            "served": self._served,
            "engine_unfinished": len(self._running),
            **weights_stats(self._weights.serving),
        }

    async def load_weights(
        self, *, weights_path: str, weights_id: str, policy_version: str = "", pin_replica: str = ""
    ) -> str:
        """Pretend to load `weights_path` (the script's answers do not change); serve it as `weights_id`."""
        del pin_replica
        await self._weights.loaded(WeightsRef(weights_id, weights_path, policy_version))
        return self._replica_id

    async def check_health(self) -> None:
        """Healthy unless it serves weights the application no longer serves (weights_record.py)."""
        await self._weights.check()


async def _pretend_load(ref: WeightsRef) -> None:
    """A fake replica's weights are its script: loading changes only what it reports."""
    del ref
