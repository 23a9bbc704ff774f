"""`Replica`: the half of a Serve replica (`VLLMReplica`, `FakeReplica`) that is not the engine.

It keeps the replica's id, its running requests (what `abort` may stop) and served count, and its
weights record (weights_record.py), and serves the keyword-only methods the router and
`RayServeBackend` call (the router reads `session_id`, `pin_replica` and `avoid_replica`, see
router.py). With tracing on (the gateway's OTEL_* variables, passed on by deployment.py), each
request is a `replica.generate` span, child of the gateway's span for it (`trace_context`).
A subclass builds its engine in `async __init__`, then awaits `_start(config, load)`,
and supplies `_generate`, `_whole_output`, `_abort` and `_engine_stats`.
"""

from __future__ import annotations

from abc import ABC
from abc import abstractmethod
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import aclosing
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from ray import serve

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import Sampling
from rollmesh.mesh import tracing
from rollmesh.serving.batching import BatchItem
from rollmesh.serving.batching import BatchReport
from rollmesh.serving.batching import run_batch
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.weights_record import ReplicaWeights
from rollmesh.serving.weights_record import WeightsRef


class Replica(ABC):
    async def _start(self, config: ServingConfig, load: Callable[[WeightsRef], Awaitable[None]]) -> None:
        """Name this replica and load the application's current weights with `load`."""
        self._replica_id: str = serve.get_replica_context().replica_id.unique_id
        tracing.configure("replica")  # when the gateway's OTEL_* variables reached it (deployment.py)
        self._running: set[str] = set()
        self._served = 0
        self._weights = ReplicaWeights(config.app_name, config.model_path, load)
        await self._weights.startup(pending_timeout_s=config.startup_timeout_s)

    @contextmanager
    def _tracked(self, request_id: str) -> Iterator[None]:
        """`request_id` counts as running here (abort finds it) until it ends, then as served."""
        self._running.add(request_id)
        try:
            yield
        finally:
            self._running.discard(request_id)
            self._served += 1

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        session_id: str = "",
        avoid_replica: str = "",
        stream: bool = True,
        trace_context: dict[str, str] | None = None,
    ) -> AsyncIterator[EngineChunk]:
        """Stream deltas for one prompt; the last chunk has `finish_reason`.

        `stream=False` (unary Generate): an empty chunk at once (it tells the caller which replica
        runs the request, for abort), then the whole output in one chunk: every chunk is a Ray object
        sent between processes, and one per engine step costs more than the step itself."""
        del avoid_replica  # a routing hint, read by the router
        span = tracing.start_from(
            "replica.generate", trace_context or {}, self._span_attributes(batched=False)
        )
        error: BaseException | None = None
        try:
            with self._tracked(request_id):
                chunks = self._generate(request_id, prompt_token_ids, sampling, session_id, stream)
                async with aclosing(chunks):
                    async for chunk in chunks:
                        yield chunk
        except Exception as exc:
            error = exc
            raise
        finally:
            tracing.end(span, error=error)

    def _span_attributes(self, *, batched: bool) -> dict[str, Any]:
        return {"rollmesh.replica": self._replica_id, "rollmesh.batched": batched}

    @abstractmethod
    def _generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: Sampling, session_id: str, stream: bool
    ) -> AsyncGenerator[EngineChunk, None]:
        """The engine's part (VLLMReplica, FakeReplica)."""

    async def generate_batch(
        self, *, requests: list[BatchItem], batch_size: int = 0, avoid_replica: str = ""
    ) -> AsyncIterator[BatchReport]:
        """Run many whole-output requests at once; reports as they finish (see batching.py).
        `batch_size` and `avoid_replica` are routing hints, read by the router."""
        del batch_size, avoid_replica
        async for report in run_batch(self._replica_id, requests, self._whole_output_tracked):
            yield report

    async def _whole_output_tracked(self, item: BatchItem) -> EngineChunk:
        span = tracing.start_from("replica.generate", item.trace_context, self._span_attributes(batched=True))
        error: BaseException | None = None
        try:
            with self._tracked(item.request_id):
                return await self._whole_output(item)
        except Exception as exc:
            error = exc
            raise
        finally:
            tracing.end(span, error=error)

    @abstractmethod
    async def _whole_output(self, item: BatchItem) -> EngineChunk:
        """The engine's part (VLLMReplica, FakeReplica)."""

    async def abort(self, *, request_id: str, pin_replica: str = "") -> bool:
        """Abort a request running here; False when it is not running here."""
        del pin_replica
        if request_id not in self._running:
            return False
        return await self._abort(request_id)

    @abstractmethod
    async def _abort(self, request_id: str) -> bool:
        """The engine's part (VLLMReplica, FakeReplica)."""

    async def load_weights(
        self, *, weights_path: str, weights_id: str, policy_version: str = "", pin_replica: str = ""
    ) -> str:
        """Load the checkpoint folder `weights_path` and serve it as `weights_id` (labelled
        `policy_version`); returns the replica's id. Refused while requests run here: the gateway
        drains them first."""
        del pin_replica
        if self._running:
            raise RuntimeError(f"{len(self._running)} requests are running; the gateway drains them first")
        await self._weights.loaded(WeightsRef(weights_id, weights_path, policy_version))
        return self._replica_id

    async def stats(self, *, pin_replica: str = "") -> dict[str, Any]:
        del pin_replica
        return {
            "replica_id": self._replica_id,
            "in_flight": len(self._running),
            "served": self._served,
            **await self._engine_stats(),
            **asdict(self._weights.serving),  # the weights it serves
        }

    @abstractmethod
    async def _engine_stats(self) -> dict[str, Any]:
        """The engine's part (VLLMReplica, FakeReplica)."""

    async def check_health(self) -> None:
        """Serve's health probe: raises when the replica serves weights the application no longer
        serves (Serve then replaces it, see weights_record.py)."""
        await self._weights.check()
