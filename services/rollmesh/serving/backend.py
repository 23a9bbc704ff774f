"""`RayServeBackend`: the gateway's default `ModelBackend`, data-parallel vLLM replicas on Ray Serve.

Routing (see router.py): a custom Ray Serve `RequestRouter` (`SessionAffinityRouter`, configured on
the deployment through `request_router_config`) runs inside this process's deployment handle. It
keeps each `session_id` on the replica it used last (prefix cache) and sends new sessions to the
least-loaded replica. `abort` and per-replica stats are pinned to one replica by the same router
(`pin_replica`), so an abort reaches the replica running the request. The router is the one
owner of session placement: this backend keeps no session table (the gateway's session store
records where each session's last turn ran, as the engine reported it, for ListModels).

Weight updates (`load_weights`, behind the gateway's UpdateWeights): every live replica loads the
checkpoint folder at once (each through vLLM's `reload_weights`); when one fails, every replica is
reloaded from the previous folder and `WeightLoadFailed` names the failures, so the model never
serves mixed weights. The folder must be readable on every replica's host (shared filesystem).
Each load gets a unique weights id, kept in the application's weights record (weights_record.py):
a replica Serve starts later loads the record's current weights before it takes traffic. Every
response names the weights its replica served; one whose weights are not the current ones is never
passed on (`StaleReplica`): the request runs on another replica, as after a replica failure, and
that replica fails its next health check, so Serve replaces it.

Whole-output requests without a session (`stream=False`, no `session_id`: single-turn rollouts)
travel to the replicas in micro-batches, one Serve call for many (batching.py); the rest go one call
each. Abort, cancellation and failover behave the same on both paths.

Failover: a request whose replica dies before the first token is streamed is retried once on
another replica (`avoid_replica`); after a token has been streamed, or when the retry fails too,
`BackendUnavailable` is raised. Serve replaces dead replicas on its own; `replicas()` shows them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.base import ModelBackend
from rollmesh.gateway.backends.base import ModelCard
from rollmesh.gateway.backends.base import ReplicaStatus
from rollmesh.gateway.backends.base import Tokenizer
from rollmesh.gateway.errors import BackendUnavailable
from rollmesh.gateway.errors import WeightLoadFailed
from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.errors import InvalidArgument
from rollmesh.mesh.logging import get_logger
from rollmesh.serving.batching import Batcher
from rollmesh.serving.batching import BatchItem
from rollmesh.serving.batching import BatchReport
from rollmesh.serving.batching import Ticket
from rollmesh.serving.cluster import ServingCluster
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.errors import BatchItemFailed
from rollmesh.serving.errors import EngineRejected
from rollmesh.serving.errors import RequestRejected
from rollmesh.serving.errors import StaleReplica
from rollmesh.serving.weights_record import WeightsRecord
from rollmesh.serving.weights_record import WeightsRef
from rollmesh.serving.weights_record import write_record

log = get_logger(__name__)

_STATS_TIMEOUT_S = 10.0
_ABORT_TIMEOUT_S = 10.0
_LOAD_TIMEOUT_S = 600.0


def _is_replica_failure(exc: BaseException) -> bool:
    """True when the replica (not the request) failed: its actor died or became unreachable."""
    from ray.exceptions import ActorDiedError
    from ray.exceptions import ActorUnavailableError
    from ray.exceptions import RayActorError

    return isinstance(exc, ActorDiedError | ActorUnavailableError | RayActorError)


class RayServeBackend(ModelBackend):
    supports_token_ids = True

    def __init__(self, config: ServingConfig) -> None:
        self.config = config
        self.cluster = ServingCluster(config)
        self._tokenizer: Any = None
        self._max_model_len = config.max_model_len
        self._handle: Any = None
        self._where: dict[str, str] = {}  # request id -> replica id, while streaming
        self._streams: dict[str, Any] = {}  # request id -> DeploymentResponseGenerator
        self._tickets: dict[str, Ticket] = {}  # request id -> its place in a micro-batch
        self._batcher = Batcher(self._send_batch)
        self._aborts = TaskSet()
        self._weights = WeightsRecord.initial(config.model_path)  # what the cluster's record says

    @classmethod
    def from_env(cls, model_path: str | Path, *, model_name: str = "", **overrides: Any) -> RayServeBackend:
        return cls(ServingConfig.from_env(model_path, model_name=model_name, **overrides))

    @property
    def card(self) -> ModelCard:
        return ModelCard(
            name=self.config.name,
            backend="ray-serve",
            max_model_len=self._max_model_len,
            extra={
                "replicas": self.config.replicas,
                "device": self.config.device,
                "engine": self.config.engine,
                "tensor_parallel_size": self.config.tensor_parallel_size,
                "model_path": self.config.model_path,
            },
        )

    @property
    def tokenizer(self) -> Tokenizer | None:
        return self._tokenizer  # type: ignore[no-any-return]

    async def start(self) -> None:
        # The tokenizer loads while Ray starts and the replicas load their engines.
        tokenizer = asyncio.create_task(asyncio.to_thread(_load_tokenizer, self.config))
        try:
            self._handle = await self.cluster.start()
        finally:
            await asyncio.wait([tokenizer])
        self._tokenizer, model_len = tokenizer.result()
        self._max_model_len = self.config.max_model_len or model_len
        self._handle = await _routing_on_this_loop(self.config.app_name, self._handle)

    def _require_handle(self) -> Any:
        if self._handle is None:
            raise BackendUnavailable("the Ray Serve backend is not started", retry_after_s=5.0)
        return self._handle

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        self._require_handle()
        if not request.prompt_token_ids:
            raise InvalidArgument("the Ray Serve backend needs prompt_token_ids")
        one_try = self._in_batch if not request.stream and not request.session_id else self._in_call
        rid = request.request_id
        avoid = ""
        for attempt in (1, 2):
            streamed = False
            try:
                async with aclosing(one_try(request, avoid)) as chunks:
                    async for chunk in chunks:
                        streamed = streamed or bool(chunk.token_ids or chunk.text or chunk.finish_reason)
                        yield chunk
                return
            except RequestRejected as exc:
                raise EngineRejected(f"vLLM rejected request {rid}: {_short(exc, 500)}") from exc
            except BatchItemFailed as exc:
                raise BackendUnavailable(
                    f"request {rid} failed on its replica: {exc}", retry_after_s=2.0
                ) from exc
            except Exception as exc:
                if not (_is_replica_failure(exc) or isinstance(exc, StaleReplica)):
                    raise
                failed = self._where.get(rid, "")
                log.warning(
                    "replica_failed_during_request",
                    request_id=rid,
                    replica_id=failed,
                    attempt=attempt,
                    streamed=streamed,
                    error=type(exc).__name__,
                )
                if streamed or attempt == 2:
                    raise BackendUnavailable(
                        f"replica {failed or '?'} failed while serving {rid} "
                        f"({'after' if streamed else 'before'} streaming; attempt {attempt}): {exc}",
                        retry_after_s=2.0,
                    ) from exc
                avoid = failed
            finally:
                self._where.pop(rid, None)

    async def _in_call(self, request: EngineRequest, avoid: str) -> AsyncGenerator[EngineChunk, None]:
        """One Serve call of its own for the request; its first chunk says which replica runs it."""
        rid = request.request_id
        handle = self._require_handle()
        stream = handle.options(stream=True).generate.remote(
            request_id=rid,
            prompt_token_ids=list(request.prompt_token_ids),
            sampling=request.sampling,
            session_id=request.session_id,
            avoid_replica=avoid,
            stream=request.stream,
            trace_context=dict(request.trace_context),
        )
        self._streams[rid] = stream
        completed = False
        try:
            async for chunk in stream:
                if rid not in self._where:
                    self._where[rid] = chunk.replica_id
                    self._refuse_stale(chunk)
                yield chunk
            completed = True
        finally:
            self._streams.pop(rid, None)
            if not completed:
                stream.cancel()  # the replica's generator is cancelled, which aborts the engine request

    def _send_batch(self, items: list[BatchItem], avoid_replica: str) -> AsyncIterator[BatchReport]:
        handle = self._require_handle()
        stream: AsyncIterator[BatchReport] = handle.options(stream=True).generate_batch.remote(
            requests=items, batch_size=len(items), avoid_replica=avoid_replica
        )
        return stream

    async def _in_batch(self, request: EngineRequest, avoid: str) -> AsyncGenerator[EngineChunk, None]:
        """A whole-output request without a session, sent in a micro-batch (batching.py): the
        replica's id first (an empty chunk, for abort), then the whole output in one chunk."""
        rid = request.request_id
        item = BatchItem(rid, list(request.prompt_token_ids), request.sampling, dict(request.trace_context))
        ticket = self._batcher.submit(item, avoid_replica=avoid)
        self._tickets[rid] = ticket
        try:
            if replica := await ticket.replica:
                self._where[rid] = replica
                yield EngineChunk(replica_id=replica)
            output = await ticket.output
            self._refuse_stale(output)
            yield output
        finally:
            self._tickets.pop(rid, None)
            replica_id = self._where.get(rid, "")
            if not ticket.output.done() and not self._batcher.cancel(ticket) and replica_id:
                self._abort_later(rid, replica_id)  # the caller left: stop it on its replica

    def _abort_later(self, request_id: str, replica_id: str) -> None:
        self._aborts.spawn(self._abort_on(request_id, replica_id), name=f"abort-{request_id}")

    async def _abort_on(self, request_id: str, replica_id: str) -> bool | None:
        """Whether the replica aborted the request; None when it did not answer."""
        try:
            async with asyncio.timeout(_ABORT_TIMEOUT_S):
                aborted: bool = await self._handle.abort.remote(request_id=request_id, pin_replica=replica_id)
                return aborted
        except Exception as exc:
            log.warning("abort_failed", request_id=request_id, replica_id=replica_id, error=repr(exc))
            return None

    async def abort(self, request_id: str) -> bool:
        ticket = self._tickets.get(request_id)
        stream = self._streams.get(request_id)
        if self._handle is None or (ticket is None and stream is None):
            return False
        if ticket is not None and self._batcher.cancel(ticket):
            return True  # its batch had not left: it ends with finish_reason "abort"
        replica = self._where.get(request_id)
        aborted = await self._abort_on(request_id, replica) if replica else None
        if aborted is None and stream is not None:
            stream.cancel()  # not routed yet, or the abort failed: cancelling stops it wherever it lands
            return True
        return bool(aborted)

    def _refuse_stale(self, chunk: EngineChunk) -> None:
        current = self._weights.current.weights_id
        if chunk.weights_id and chunk.weights_id != current:
            log.error(
                "replica_serves_stale_weights",
                replica_id=chunk.replica_id,
                weights_id=chunk.weights_id,
                current=current,
            )
            raise StaleReplica(
                f"replica {chunk.replica_id} serves weights {chunk.weights_id}, not the current {current}"
            )

    @property
    def weights_path(self) -> Path | None:
        return Path(self._weights.current.weights_path)

    @property
    def current_weights(self) -> WeightsRef:
        """The weights every replica must serve now (id, folder, policy version)."""
        return self._weights.current

    async def load_weights(self, checkpoint: Path, *, policy_version: str = "") -> list[str]:
        self._require_handle()
        ids = await self.cluster.replica_ids()
        if not ids:
            raise BackendUnavailable("no live replica to load weights into", retry_after_s=5.0)
        previous = self._weights
        new = WeightsRef(uuid.uuid4().hex[:12], str(checkpoint), policy_version)
        app = self.config.app_name
        await asyncio.to_thread(write_record, app, previous.with_pending(new))  # replicas starting now wait
        results = await asyncio.gather(*(self._load_on(r, new) for r in ids), return_exceptions=True)
        failures = {r: _short(e) for r, e in zip(ids, results, strict=True) if isinstance(e, BaseException)}
        if not failures:
            self._weights = WeightsRecord(new)
            await asyncio.to_thread(write_record, app, self._weights)
            return ids
        old = previous.current
        restored = await asyncio.gather(*(self._load_on(r, old) for r in ids), return_exceptions=True)
        await asyncio.to_thread(write_record, app, previous)
        stuck = [r for r, e in zip(ids, restored, strict=True) if isinstance(e, BaseException)]
        detail = "; ".join(f"{r}: {e}" for r, e in failures.items())
        log.error("weights_load_failed", checkpoint=str(checkpoint), failures=detail, not_restored=stuck)
        raise WeightLoadFailed(
            f"{len(failures)} of {len(ids)} replicas failed to load {checkpoint} ({detail}); "
            f"every replica was reloaded from {old.weights_path}"
            + (f", except {', '.join(stuck)} (not restored)" if stuck else ""),
            metadata={"replica_errors": detail, "not_restored": ",".join(stuck)},
        )

    async def _load_on(self, replica_id: str, ref: WeightsRef) -> str:
        async with asyncio.timeout(_LOAD_TIMEOUT_S):
            loaded: str = await self._handle.load_weights.remote(
                weights_path=ref.weights_path,
                weights_id=ref.weights_id,
                policy_version=ref.policy_version,
                pin_replica=replica_id,
            )
        return loaded

    async def hold_engine(self, replica_id: str, *, held: bool) -> bool:
        """`VLLMReplica.hold` on one replica (for tests and operators): whether its engine is held now."""
        handle = self._require_handle()
        async with asyncio.timeout(_STATS_TIMEOUT_S):
            now: bool = await handle.hold.remote(held=held, pin_replica=replica_id)
        return now

    async def replicas(self) -> list[ReplicaStatus]:
        if self._handle is None:
            return []
        ids = await self.cluster.replica_ids()
        stats = await asyncio.gather(*(self.replica_stats(r) for r in ids))
        return [
            ReplicaStatus(
                replica_id=rid,
                healthy=s is not None,
                in_flight=int(s["in_flight"]) if s else 0,
                weights_id=str(s.get("weights_id", "")) if s else "",
                policy_version=str(s.get("policy_version", "")) if s else "",
                max_batch=int(s.get("max_batch", 0)) if s else 0,
            )
            for rid, s in zip(ids, stats, strict=True)
        ]

    async def replica_stats(self, replica_id: str) -> dict[str, Any] | None:
        """One replica's own figures (`VLLMReplica.stats`), None when it does not answer (or the
        backend is not started)."""
        try:
            async with asyncio.timeout(_STATS_TIMEOUT_S):
                result: dict[str, Any] = await self._handle.stats.remote(pin_replica=replica_id)
                return result
        except Exception:
            return None

    async def shutdown(self) -> None:
        for stream in list(self._streams.values()):
            stream.cancel()
        await self._batcher.aclose()
        await self._aborts.aclose()
        self._handle = None
        await self.cluster.shutdown()


async def _routing_on_this_loop(app_name: str, handle: Any) -> Any:
    """A handle whose router runs on this event loop. Serve's default runs it on a thread of its
    own, and every call and every streamed object then crosses threads twice (measured with
    engine="fake" replicas, 16 requests in flight: 1.23 -> 0.83 ms CPU per request). Every use of
    the backend's handle is on this loop. Falls back to `handle` if Serve has no such option."""
    from ray import serve

    fresh = await asyncio.to_thread(serve.get_app_handle, app_name)
    try:
        fresh._init(_run_router_in_separate_loop=False)  # type: ignore[no-untyped-call]
    except (RuntimeError, TypeError) as exc:
        log.warning("serve_handle_default_router", error=str(exc)[:300])
        return handle
    return fresh


def _short(exc: BaseException, limit: int = 300) -> str:
    """The last line of a (Ray-wrapped) exception's text: the replica's own error message."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:limit]


def _load_tokenizer(config: ServingConfig) -> tuple[Any, int]:
    """The gateway-side tokenizer and the model's context length (0: unknown)."""
    if config.engine == "fake":
        from rollmesh.serving.fake_replica import fake_tokenizer

        return fake_tokenizer()
    import json

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.model_path)
    max_len = 0
    cfg = Path(config.model_path) / "config.json"
    if cfg.is_file():
        max_len = int(json.loads(cfg.read_text()).get("max_position_embeddings", 0))
    return tokenizer, max_len
