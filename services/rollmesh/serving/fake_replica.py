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
from collections.abc import AsyncGenerator
from typing import Any

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.base import Sampling
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.backends.fake import FakeTokenizer
from rollmesh.serving.batching import BatchItem
from rollmesh.serving.batching import merge_chunks
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.replica import Replica
from rollmesh.serving.weights_record import WeightsRef

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


class FakeReplica(Replica):
    """`VLLMReplica`'s methods (replica.py) over the scripted engine."""

    async def __init__(self, config: ServingConfig) -> None:  # type: ignore[misc]  # Serve awaits it
        self._engine = FakeBackend(
            config.name,
            script=arithmetic_script,
            max_model_len=FAKE_MAX_MODEL_LEN,
            token_latency_s=config.fake_token_latency_s,
        )
        await self._start(config, _pretend_load)

    async def _generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: Sampling, session_id: str, stream: bool
    ) -> AsyncGenerator[EngineChunk, None]:
        request = EngineRequest(
            request_id=request_id,
            sampling=sampling,
            prompt_token_ids=tuple(prompt_token_ids),
            session_id=session_id,
            stream=stream,
        )
        weights_id = self._weights.serving.weights_id
        if stream:
            async for chunk in self._engine.generate(request):
                yield dataclasses.replace(chunk, replica_id=self._replica_id, weights_id=weights_id)
            return
        yield EngineChunk(replica_id=self._replica_id, weights_id=weights_id)
        yield await self._whole(request)

    async def _whole_output(self, item: BatchItem) -> EngineChunk:
        return await self._whole(
            EngineRequest(
                request_id=item.request_id,
                sampling=item.sampling,
                prompt_token_ids=tuple(item.prompt_token_ids),
                stream=False,
            )
        )

    async def _whole(self, request: EngineRequest) -> EngineChunk:
        chunks = [c async for c in self._engine.generate(request)] or [EngineChunk(finish_reason="stop")]
        whole = merge_chunks(chunks)
        return dataclasses.replace(
            whole, replica_id=self._replica_id, weights_id=self._weights.serving.weights_id
        )

    async def _abort(self, request_id: str) -> bool:
        return await self._engine.abort(request_id)

    async def _engine_stats(self) -> dict[str, Any]:
        return {"engine_unfinished": len(self._running)}


async def _pretend_load(ref: WeightsRef) -> None:
    """A fake replica's weights are its script: loading changes only what it reports."""
    del ref
