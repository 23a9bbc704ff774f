"""`Gateway`: the domain object behind both doors (the gRPC servicer and the OpenAI HTTP facade).

It holds the backends by model name, named routes, per-model policy version and pause state, the
session store (token-exact multi-turn), the open captures (captures.py), the in-flight requests
(for Abort and per-replica accounting), and runs one generation as a stream of `StreamDelta`s
ending with a `GenerateResult`.
No grpc and no HTTP here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Literal

from rollmesh.gateway import errors
from rollmesh.gateway import telemetry
from rollmesh.gateway.backends.base import EngineRequest
from rollmesh.gateway.backends.base import ModelBackend
from rollmesh.gateway.backends.base import ReplicaStatus
from rollmesh.gateway.backends.base import Sampling
from rollmesh.gateway.backends.base import SamplingInput
from rollmesh.gateway.captures import CaptureStore
from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.gateway.sessions import FreshPromptCache
from rollmesh.gateway.sessions import SessionState
from rollmesh.gateway.sessions import SessionStore
from rollmesh.gateway.sessions import build_prompt
from rollmesh.gateway.sessions import tools_key
from rollmesh.gateway.toolcalls import call_id_prefix
from rollmesh.gateway.toolcalls import parse_tool_calls
from rollmesh.gateway.types import GenerateInput
from rollmesh.gateway.types import GenerateResult
from rollmesh.gateway.types import ModelStatus
from rollmesh.gateway.types import StreamDelta
from rollmesh.gateway.types import Usage
from rollmesh.gateway.types import WeightUpdate
from rollmesh.gateway.uploads import UploadPiece
from rollmesh.gateway.uploads import WeightUploads
from rollmesh.gateway.weights import check_checkpoint
from rollmesh.gateway.weights import next_version
from rollmesh.gateway.weights import read_manifest
from rollmesh.mesh import tracing
from rollmesh.mesh import untrusted_json
from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolSpec
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.versions import spans_of_starts

log = get_logger("rollmesh.gateway")

BackendFactory = Callable[[ModelSpec], ModelBackend]
InFlight = Literal["finish", "abort_and_retry", "continue"]
DEFAULT_DRAIN_TIMEOUT_S = 300.0
# UploadWeights: bytes allowed beyond the served safetensors (config, tokenizer, generation config).
_UPLOAD_MARGIN_BYTES = 64 * 1024 * 1024
# ABORT_AND_RETRY / CONTINUE: how often aborts are re-sent to generations that reached the engine meanwhile.
# How often the replicas' health is read for the metrics (rollmesh_gateway_replica_up).
REPLICA_WATCH_S = 10.0
_REABORT_PERIOD_S = 0.5


@dataclass
class _Model:
    name: str
    backend: ModelBackend
    policy_version: str = "0"  # the weights first served; UpdateWeights counts up from it
    running: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: Counter[str] = field(default_factory=Counter)
    spec: ModelSpec | None = None  # set for routes the gateway created (and must shut down)
    generating: set[str] = field(default_factory=set)  # request ids past the pause gate
    waiting: int = 0  # generations held at the pause gate now
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while `generating` is empty
    updating: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight update at a time
    reference: Path | None = None  # the checkpoint first served: what new weights are checked against
    # Each replica's health as last read from the backend (REPLICA_WATCH_S, and every status call):
    # what metrics show for a replica with nothing in flight.
    replica_health: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.running.set()
        self.idle.set()
        telemetry.model_served(self.name)

    def enter(self, rid: str) -> None:
        self.generating.add(rid)
        self.idle.clear()

    def leave(self, rid: str) -> None:
        self.generating.discard(rid)
        if not self.generating:
            self.idle.set()


@dataclass
class _Flight:
    model: _Model
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    # Set by an ABORT_AND_RETRY or CONTINUE weight update: the engine request was aborted to run again.
    retry: bool = False
    queued_s: float | None = None  # arrival to the first pass of the pause gate
    # CONTINUE: it runs again from the ids it produced (partial rollout), not from its prompt.
    keep: bool = False


@dataclass
class _Attempt:
    """One run of a generation on the engine (a weight update may make it run again)."""

    version: str
    prompt_ids: tuple[int, ...]
    # (policy version, offset of the first output id it produced): one entry unless a CONTINUE
    # weight update let the generation go on on new weights.
    starts: list[tuple[str, int]] = field(default_factory=list)
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    replica: str = ""
    finish: str | None = None
    reported_usage: tuple[int, int] = (0, 0)  # token counts the backend reported (message-only backends)
    streamed: bool = False  # deltas reached the caller
    arrived: float = 0.0  # time.perf_counter() when the generation arrived (time to first token)
    first_token_s: float = 0.0  # seconds from arrival to the engine's first output (0: none yet)

    def resume_on(self, version: str) -> None:
        """The ids from here on come from `version` (a version that produced nothing is forgotten)."""
        at = len(self.out_ids)
        if self.starts and self.starts[-1][1] == at:
            self.starts.pop()
        if not self.starts or self.starts[-1][0] != version:
            self.starts.append((version, at))
        self.version = self.starts[0][0]


def validate_sampling(
    s: SamplingInput, *, max_model_len: int, prompt_len: int | None, default_max_tokens: int
) -> Sampling:
    """Check ranges (INVALID_ARGUMENT naming the field), then the prompt against the context
    (RESOURCE_EXHAUSTED). max_tokens is clamped to the context left after the prompt."""

    def bad(name: str, problem: str) -> errors.InvalidSampling:
        return errors.InvalidSampling(f"sampling.{name} {problem}", metadata={"field": f"sampling.{name}"})

    if s.temperature is not None and not (math.isfinite(s.temperature) and s.temperature >= 0):
        raise bad("temperature", f"must be >= 0 (0 is greedy), got {s.temperature}")
    if s.top_p is not None and not (0 < s.top_p <= 1):
        raise bad("top_p", f"must be in (0, 1], got {s.top_p}")
    if s.top_k is not None and s.top_k < -1:
        raise bad("top_k", f"must be -1 (off), 0 (off) or > 0, got {s.top_k}")
    if s.max_tokens is not None and s.max_tokens <= 0:
        raise bad("max_tokens", f"must be > 0, got {s.max_tokens}")
    if s.max_tokens is not None and max_model_len and s.max_tokens > max_model_len:
        raise bad("max_tokens", f"is {s.max_tokens}, beyond the model's context of {max_model_len} tokens")
    max_tokens = s.max_tokens or default_max_tokens
    if max_model_len and prompt_len is not None:
        if prompt_len >= max_model_len:
            raise errors.PromptTooLong(
                f"the prompt has {prompt_len} tokens; the model's context is {max_model_len} tokens, "
                "which leaves no room to generate",
                metadata={"prompt_tokens": str(prompt_len), "max_model_len": str(max_model_len)},
            )
        max_tokens = min(max_tokens, max_model_len - prompt_len)
    return Sampling(
        temperature=1.0 if s.temperature is None else s.temperature,
        top_p=1.0 if s.top_p is None else s.top_p,
        top_k=-1 if s.top_k in (None, 0) else int(s.top_k),
        max_tokens=max_tokens,
        stop=tuple(x for x in s.stop if x),
        seed=s.seed,
        logprobs=s.logprobs,
        ignore_eos=s.ignore_eos,
    )


def _validate_tools(tools: Sequence[ToolSpec]) -> None:
    for i, t in enumerate(tools):
        if not t.name:
            raise errors.bad_request(f"tools[{i}].name is empty", f"tools[{i}].name")
        where = f"tools[{i}].parameters_json"
        if t.parameters_json:
            try:
                params = untrusted_json.loads(t.parameters_json)
            except ValueError as exc:
                raise errors.bad_request(f"{where} is not JSON: {exc}", where) from None
            if not isinstance(params, dict):
                raise errors.bad_request(f"{where} must be a JSON Schema object", where)


def before_stop_string(text: str, stop: Sequence[str], last_from: int) -> str:
    """`text` up to the stop string its last token (from `last_from` on) completed: the text an
    OpenAI server answers. vLLM ends a request on a stop string with the ids that completed it, so
    decoding its ids gives the stop string and whatever else its last token holds ("The answer" for
    stop " " after "The"): the ids stay what the engine produced, the message is what the caller
    asked for. Only an occurrence that ends in the last token counts (vLLM stopped at the first one
    in its text; an earlier one in `text` can only be inside a special token, which vLLM's text
    leaves out)."""
    found = (text.find(s, max(0, last_from - len(s) + 1)) for s in stop if s)
    cut = min((at for at in found if at >= 0), default=-1)
    return text if cut < 0 else text[:cut]


@dataclass
class _StopAcross:
    """A stop string that starts in the ids a generation produced before a CONTINUE weight update
    and ends in what it produces after: the engine, given those ids as prompt, never sees it whole,
    so the gateway looks for it in the first ids after the resume point and ends the generation
    there, as one uninterrupted run would have."""

    tokenizer: Any
    stop: tuple[str, ...]
    boundary: int  # output ids produced before the resume point
    boundary_text: int  # their decoded length
    done: bool = False

    @classmethod
    def of(cls, m: _Model, request: EngineRequest, attempt: _Attempt) -> _StopAcross | None:
        tokenizer = m.backend.tokenizer if m.backend.supports_token_ids else None
        stop = tuple(x for x in request.sampling.stop if len(x) > 1)  # a 1-char one cannot span
        if tokenizer is None or not stop or not attempt.out_ids:
            return None
        text = tokenizer.decode(attempt.out_ids, skip_special_tokens=False)
        return cls(tokenizer, stop, len(attempt.out_ids), len(text))

    def check(self, out_ids: list[int]) -> int | None:
        """How many output ids to keep (up to the one that completes a stop string spanning the
        resume point), or None: none (yet). Checks only until the text after the resume point is
        longer than any stop string: no occurrence can span it after that."""
        if self.done:
            return None
        longest = max(len(s) for s in self.stop)
        for end in range(self.boundary + 1, len(out_ids) + 1):
            text = self.tokenizer.decode(out_ids[:end], skip_special_tokens=False)
            for s in self.stop:
                at = text.find(s, max(0, self.boundary_text - len(s) + 1))
                if 0 <= at < self.boundary_text:
                    return end
            if len(text) - self.boundary_text >= longest - 1:
                self.done = True
                return None
        return None


def _leave_replica(m: _Model, replica: str) -> None:
    """One request fewer in flight on `replica` (per-replica accounting for ListModels)."""
    m.in_flight[replica] -= 1
    if m.in_flight[replica] <= 0:
        del m.in_flight[replica]


class Gateway:
    """Serve `backends` (by their card's name) with `config`'s limits (its `models` are the caller's to
    create); its `default_model`, else the first backend's, answers requests naming no model."""

    def __init__(
        self,
        backends: Sequence[ModelBackend],
        config: GatewayConfig | None = None,
        *,
        backend_factory: BackendFactory | None = None,
    ) -> None:
        cfg = config or GatewayConfig()
        if not backends:
            raise ValueError("a gateway needs at least one backend")
        self._models: dict[str, _Model] = {}
        for b in backends:
            if b.card.name in self._models:
                raise ValueError(f"two backends serve the model name {b.card.name!r}")
            self._models[b.card.name] = _Model(b.card.name, b)
        self.default_model = cfg.default_model or backends[0].card.name
        if self.default_model not in self._models:
            raise ValueError(f"default model {self.default_model!r} is not served")
        self._aliases: dict[str, str] = {}
        self._route_count = 0
        self.max_routes = cfg.max_routes
        self.default_max_tokens = cfg.default_max_tokens
        self.sessions = SessionStore(ttl_s=cfg.session_ttl_s, max_sessions=cfg.max_sessions)
        self.captures = CaptureStore()  # external agent programs' URLs (captures.py; the facade serves them)
        self._fresh_prompts = FreshPromptCache()
        self._flights: dict[str, _Flight] = {}
        self._factory = backend_factory
        staging = Path(cfg.weights_staging_dir or tempfile.gettempdir())
        self.uploads = WeightUploads(staging / "rollmesh-weights")
        self._replica_watch: asyncio.Task[None] | None = None
        telemetry.LIVE.watch(self.live_models)  # in flight, held, policy version: read at scrape time

    def live_models(self) -> list[telemetry.ModelNow]:
        """The models and routes served now, as a metrics scrape reads them (on the endpoint's
        thread: copies only)."""
        return [
            telemetry.ModelNow(
                m.name,
                len(m.generating),
                {**dict.fromkeys(m.replica_health, 0), **m.in_flight},
                dict(m.replica_health),
                not m.running.is_set(),
                m.waiting,
                m.policy_version,
            )
            for m in list(self._models.values())
        ]

    async def start(self) -> None:
        await asyncio.gather(*(m.backend.start() for m in self._models.values()))
        self._replica_watch = asyncio.create_task(self._watch_replicas(), name="replica-watch")

    async def _watch_replicas(self) -> None:
        """Read every model's replicas now and then, for the metrics' per-replica series (a status
        call reads them too)."""
        while True:
            for name, m in list(self._models.items()):
                await self._status(name, m)
            await asyncio.sleep(REPLICA_WATCH_S)

    async def shutdown(self) -> None:
        if self._replica_watch is not None:
            self._replica_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replica_watch
        results = await asyncio.gather(
            *(m.backend.shutdown() for m in self._models.values()), return_exceptions=True
        )
        for m, r in zip(self._models.values(), results, strict=True):
            if isinstance(r, Exception):
                log.warning("backend_shutdown_failed", model=m.name, error=str(r))
        await self.uploads.close()

    def _resolve(self, name: str) -> _Model:
        key = name or self.default_model
        key = self._aliases.get(key, key)
        model = self._models.get(key)
        if model is None:
            known = sorted([*self._models, *self._aliases])
            raise errors.ModelNotFound(
                f"no model or route named {name!r}; served: {', '.join(known)}", metadata={"model": name}
            )
        return model

    def _targets(self, name: str) -> list[_Model]:
        return list(self._models.values()) if not name else [self._resolve(name)]

    def set_policy_version(self, model: str, version: str) -> str:
        """Label later responses with `version`; returns the previous label (of the default model
        when `model` is empty, meaning every model)."""
        previous = self._resolve(model).policy_version
        for m in self._targets(model):
            m.policy_version = version
        log.info("policy_version_set", model=model or "*", version=version, previous=previous)
        return previous

    def pause(self, model: str = "") -> None:
        for m in self._targets(model):
            m.running.clear()
        log.info("generation_paused", model=model or "*")

    def resume(self, model: str = "") -> None:
        for m in self._targets(model):
            m.running.set()
        log.info("generation_resumed", model=model or "*")

    async def update_weights(
        self,
        model: str,
        checkpoint: Path,
        *,
        policy_version: str = "",
        in_flight: InFlight = "finish",
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    ) -> WeightUpdate:
        """Load `checkpoint` into every replica of `model` and label later generations with
        `policy_version` (default: previous integer + 1), as one operation.

        Order: validate the checkpoint against the served weights (nothing touched yet); hold new
        generations; "finish": wait for running ones to end (`DrainTimeout` past `drain_timeout_s`,
        nothing changed) / "abort_and_retry": abort them, they run again after the load /
        "continue": stop them, they go on after the load from the ids they produced; load into
        every replica (the backend rolls back and raises `WeightLoadFailed` when one fails); set the
        version; release held generations (unless the model was paused before). One update runs at a
        time per model; later ones wait."""
        m = self._resolve(model)
        reference = self._weights_reference(m)
        try:
            update = await self._update_weights(
                m, reference, checkpoint, policy_version, in_flight, drain_timeout_s
            )
        except BaseException:
            telemetry.WEIGHT_UPDATES.labels(m.name, "failed").inc()
            raise
        telemetry.WEIGHT_UPDATES.labels(m.name, "ok").inc()
        return update

    async def _update_weights(
        self,
        m: _Model,
        reference: Path,
        checkpoint: Path,
        policy_version: str,
        in_flight: InFlight,
        drain_timeout_s: float,
    ) -> WeightUpdate:
        async with m.updating:
            version = policy_version or next_version(m.policy_version)
            manifest = await asyncio.to_thread(check_checkpoint, checkpoint, reference)
            was_running = m.running.is_set()
            m.running.clear()
            held_at = time.monotonic()
            retried: set[str] = set()
            try:
                drained = (
                    m.idle.wait()
                    if in_flight == "finish"
                    else self._abort_for_retry(m, retried, keep=in_flight == "continue")
                )
                try:
                    await asyncio.wait_for(drained, drain_timeout_s)
                except TimeoutError:
                    raise errors.DrainTimeout(
                        f"{len(m.generating)} generations on {m.name!r} still running after "
                        f"{drain_timeout_s:g} s; the weights were not changed",
                        metadata={"model": m.name, "running": str(len(m.generating))},
                    ) from None
                replica_ids = await m.backend.load_weights(manifest.path, policy_version=version)
                previous, m.policy_version = m.policy_version, version
                await self.uploads.served(m.name, manifest.path)
            finally:
                if was_running:
                    m.running.set()
            paused_s = time.monotonic() - held_at
        log.info(
            "weights_updated",
            model=m.name,
            checkpoint=str(manifest.path),
            version=version,
            previous=previous,
            replicas=len(replica_ids),
            retried=len(retried),
            paused_s=round(paused_s, 3),
        )
        return WeightUpdate(
            policy_version=version,
            previous_version=previous,
            replica_ids=tuple(replica_ids),
            retried_requests=len(retried),
            paused_s=paused_s,
            checkpoint_path=str(manifest.path),
            tensors=len(manifest.tensors),
        )

    async def upload_weights(
        self,
        model: str,
        pieces: AsyncIterator[UploadPiece],
        *,
        policy_version: str = "",
        in_flight: InFlight = "finish",
        drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
    ) -> WeightUpdate:
        """`update_weights` from a checkpoint streamed as `pieces` (uploads.py): staged in a folder
        bounded by the served checkpoint's size (+ `_UPLOAD_MARGIN_BYTES` for config and tokenizer
        files), digests checked, then updated from; the folder is deleted when the update fails or
        once later weights replace it."""
        m = self._resolve(model)
        manifest = await asyncio.to_thread(read_manifest, self._weights_reference(m))
        folder = await self.uploads.stage(pieces, limit_bytes=manifest.total_bytes + _UPLOAD_MARGIN_BYTES)
        try:
            return await self.update_weights(
                model,
                folder,
                policy_version=policy_version,
                in_flight=in_flight,
                drain_timeout_s=drain_timeout_s,
            )
        except BaseException:
            await self.uploads.discard(folder)
            raise

    def _weights_reference(self, m: _Model) -> Path:
        """The checkpoint new weights are checked against: the one the model was first served from
        (later ones have the same tensors; a weights-only upload has no config or tokenizer)."""
        if m.reference is None:
            m.reference = m.backend.weights_path
        if m.reference is None:
            raise errors.WeightUpdatesUnsupported(
                f"model {m.name!r} ({m.backend.card.backend} backend) cannot update its weights",
                metadata={"model": m.name},
            )
        return m.reference

    async def _abort_for_retry(self, m: _Model, retried: set[str], *, keep: bool = False) -> None:
        """Abort every generation of `m` on the engine, marked to run again (`keep`: from the ids it
        produced), until none runs."""
        while m.generating:
            for rid in list(m.generating):
                flight = self._flights.get(rid)
                if flight is not None and not flight.retry:
                    flight.retry, flight.keep = True, keep
                    retried.add(rid)
                    await m.backend.abort(rid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(m.idle.wait(), _REABORT_PERIOD_S)
            for rid in list(m.generating):  # reached the engine after its abort: abort again
                flight = self._flights.get(rid)
                if flight is not None and flight.retry:
                    await m.backend.abort(rid)

    def close_session(self, session_id: str) -> bool:
        return self.sessions.close(session_id)

    def running_requests(self) -> list[str]:
        """Ids of the generations in progress (including those held by a pause)."""
        return list(self._flights)

    async def abort(self, request_id: str) -> bool:
        flight = self._flights.get(request_id)
        if flight is None:
            return False
        flight.aborted.set()
        await flight.model.backend.abort(request_id)
        return True

    async def register_route(
        self, route: str, *, target_model: str = "", base_url: str = "", api_key_env: str = ""
    ) -> ModelStatus:
        if not route or route != route.strip() or any(c.isspace() for c in route):
            raise errors.InvalidRoute(f"route name {route!r} must be non-empty without spaces")
        if base_url:
            try:  # ftp://x was answered UNAVAILABLE (retryable) after a failed connection
                spec = ModelSpec(
                    route, "openai", target_model or route, base_url=base_url, api_key_env=api_key_env
                )
            except ConfigError as exc:
                raise errors.InvalidRoute(str(exc)) from None
            existing = self._models.get(route)
            if existing is not None and existing.spec == spec:
                return await self._status(route, existing)
            self._check_free(route)
            if self._factory is None:
                raise errors.InvalidRoute("this gateway cannot create URL routes (no backend factory)")
            backend = self._factory(spec)
            try:
                await backend.start()
            except errors.BackendUnavailable as exc:
                raise errors.BackendDown(
                    f"route {route!r}: {base_url} is not reachable: {exc}", retry_after_s=exc.retry_after_s
                ) from None
            self._models[route] = _Model(route, backend, spec=spec)
            self._route_count += 1
            log.info("route_registered", route=route, base_url=base_url, target_model=spec.model)
            return await self._status(route, self._models[route])
        if not target_model:
            raise errors.InvalidRoute("give target_model (a served model) or base_url")
        target = self._resolve(target_model)
        if self._aliases.get(route) == target.name:
            return await self._status(route, target)
        self._check_free(route)
        self._aliases[route] = target.name
        self._route_count += 1
        log.info("route_registered", route=route, target_model=target.name)
        return await self._status(route, target)

    def _check_free(self, route: str) -> None:
        if route in self._models or route in self._aliases:
            raise errors.RouteExists(
                f"a model or route named {route!r} already exists", metadata={"route": route}
            )
        if self._route_count >= self.max_routes:
            raise errors.TooManyRoutes(
                f"{self._route_count} routes registered; the limit is {self.max_routes}"
            )

    async def _status(self, name: str, m: _Model) -> ModelStatus:
        try:
            reported = await m.backend.replicas()
        except Exception as exc:  # a sick backend must not break listing
            log.warning("backend_replicas_failed", model=m.name, error=str(exc))
            reported = []
        m.replica_health = {r.replica_id: r.healthy for r in reported}
        sessions = self.sessions.sessions_per_replica(m.name)
        seen = {r.replica_id: r for r in reported}
        for rid in [*m.in_flight, *sessions]:
            seen.setdefault(rid, ReplicaStatus(replica_id=rid, healthy=False))
        replicas = tuple(
            dataclasses.replace(r, in_flight=m.in_flight.get(rid, 0), sessions=sessions.get(rid, 0))
            for rid, r in seen.items()
        )
        return ModelStatus(
            name=name,
            backend=m.backend.card.backend,
            replicas=replicas,
            max_model_len=m.backend.card.max_model_len,
            policy_version=m.policy_version,
            paused=not m.running.is_set(),
            is_default=name == self.default_model,
        )

    async def list_models(self) -> list[ModelStatus]:
        out = [await self._status(name, m) for name, m in self._models.items()]
        out += [await self._status(alias, self._models[target]) for alias, target in self._aliases.items()]
        return out

    def _prepare(
        self, m: _Model, inp: GenerateInput, rid: str, *, stream: bool = True
    ) -> tuple[EngineRequest, int]:
        """The engine request for `inp`, and how many of its prompt ids a kept session gave."""
        if inp.messages and inp.prompt_token_ids:
            raise errors.bad_request("give messages or prompt_token_ids, not both", "prompt_token_ids")
        if not inp.messages and not inp.prompt_token_ids:
            raise errors.bad_request("the request has no messages and no prompt_token_ids", "messages")
        _validate_tools(inp.tools)
        empty = next((i for i, msg in enumerate(inp.messages) if not msg.role.strip()), None)
        if empty is not None:  # a chat template renders no turn for it: the model reads another prompt
            raise errors.bad_request(f"messages[{empty}].role is empty", f"messages[{empty}].role")
        card = m.backend.card
        tokenizer = m.backend.tokenizer if m.backend.supports_token_ids else None
        ids: tuple[int, ...] = ()
        reused = 0
        messages: tuple[dict[str, Any], ...] = ()
        tools: tuple[dict[str, Any], ...] = ()
        if tokenizer is None:
            if inp.prompt_token_ids:
                raise errors.TokenIdsUnsupported(
                    f"model {m.name!r} ({card.backend} backend) takes chat messages, not prompt_token_ids; "
                    "token-exact generation needs a token-id backend (ray-serve or fake)",
                    metadata={"model": m.name},
                )
            messages = tuple(x.to_openai() for x in inp.messages)
            tools = tuple(t.to_openai() for t in inp.tools)
        else:
            previous = self.sessions.get(inp.session_id) if inp.session_id else None
            if inp.prompt_token_ids:
                ids = tuple(inp.prompt_token_ids)
                if not 0 <= min(ids) <= max(ids) < len(tokenizer):  # the engine's error was INTERNAL
                    raise errors.bad_request(
                        f"prompt_token_ids must be in [0, {len(tokenizer)}) (the tokenizer's ids), "
                        f"got {min(ids)}..{max(ids)}",
                        "prompt_token_ids",
                    )
                kept = previous.token_ids if previous is not None else ()
                reused = len(kept) if kept and ids[: len(kept)] == kept else 0
            else:
                prompt = build_prompt(
                    tokenizer,
                    inp.messages,
                    inp.tools,
                    previous,
                    model=m.name,
                    fresh_cache=self._fresh_prompts,
                )
                ids, reused = prompt.token_ids, prompt.reused_prefix_tokens
                if previous is not None and prompt.fresh_reason:
                    log.info("session_restarted", session_id=inp.session_id, reason=prompt.fresh_reason)
        sampling = validate_sampling(
            inp.sampling,
            max_model_len=card.max_model_len,
            prompt_len=None if tokenizer is None else len(ids),
            default_max_tokens=self.default_max_tokens,
        )
        req = EngineRequest(
            request_id=rid,
            sampling=sampling,
            prompt_token_ids=ids,
            messages=messages,
            tools=tools,
            session_id=inp.session_id,
            stream=stream,
        )
        return req, reused

    async def _wait_running(self, m: _Model, flight: _Flight, deadline: float | None) -> None:
        if m.running.is_set():
            return
        waits = [asyncio.ensure_future(m.running.wait()), asyncio.ensure_future(flight.aborted.wait())]
        m.waiting += 1
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise errors.PausedDeadlineExceeded(
                f"generation on {m.name!r} stayed paused past the request's deadline",
                metadata={"model": m.name},
            ) from None
        finally:
            m.waiting -= 1
            for w in waits:
                w.cancel()

    async def generate(self, inp: GenerateInput, *, timeout_s: float | None = None) -> GenerateResult:
        gen = self.generate_stream(inp, timeout_s=timeout_s, deltas=False)
        async with contextlib.aclosing(gen) as stream:
            async for item in stream:
                if isinstance(item, GenerateResult):
                    return item
        raise AssertionError("generate_stream ended without a result")  # pragma: no cover

    async def generate_stream(
        self, inp: GenerateInput, *, timeout_s: float | None = None, deltas: bool = True
    ) -> AsyncGenerator[StreamDelta | GenerateResult, None]:
        """Deltas as the backend produces them, then one `GenerateResult`. Cancelling the iteration
        (client cancel) or `abort(request_id)` aborts the engine request; `timeout_s` bounds the
        wait while paused and the whole generation. `deltas=False`: the caller only wants the result,
        so the backend may deliver the output in one chunk.

        A weight update in ABORT_AND_RETRY mode aborts the engine request with `retry` set: the
        generation then runs again from its prompt on the new weights (new policy version), unless it
        already streamed deltas to its caller (then it ends with finish_reason "abort"). In CONTINUE
        mode (`keep` set too) it goes on on the new weights from the ids it produced: the engine gets
        the prompt plus those ids with the max_tokens left, the caller one output whose `versions`
        say which version produced which ids (a stream's deltas simply continue)."""
        loop = asyncio.get_running_loop()
        arrived = time.perf_counter()
        deadline = None if timeout_s is None else loop.time() + max(timeout_s, 0.0)
        m = self._resolve(inp.model)
        rid = inp.request_id or uuid.uuid4().hex
        if rid in self._flights:
            raise errors.DuplicateRequestId(
                f"request_id {rid!r} is already running", metadata={"request_id": rid}
            )
        request, reused = self._prepare(m, inp, rid, stream=deltas)
        flight = _Flight(m)
        self._flights[rid] = flight
        attempt: _Attempt | None = None
        try:
            while True:
                await self._wait_running(m, flight, deadline)
                if flight.queued_s is None:  # the first pass of the gate (a retry waits again)
                    flight.queued_s = time.perf_counter() - arrived
                    telemetry.QUEUE_SECONDS.labels(m.name).observe(flight.queued_s)
                m.enter(rid)
                try:
                    if attempt is None or not flight.keep:
                        attempt = _Attempt(
                            version=m.policy_version, prompt_ids=request.prompt_token_ids, arrived=arrived
                        )
                    flight.retry = flight.keep = False
                    attempt.resume_on(m.policy_version)
                    if not flight.aborted.is_set():
                        engine = self._run_engine(m, self._continued(request, attempt), attempt, deadline)
                        try:
                            async with contextlib.aclosing(engine):
                                async for delta in engine:
                                    if flight.retry and not flight.keep and not attempt.streamed:
                                        continue  # this attempt runs again: its output is thrown away
                                    attempt.streamed = deltas
                                    yield delta
                        except Exception:
                            # Aborted for a weight update before the engine had it (a backend may
                            # cancel such a request with an error): it runs again like the others.
                            if not (
                                flight.retry
                                and (flight.keep or not attempt.streamed)
                                and not flight.aborted.is_set()
                            ):
                                raise
                            attempt.finish = None
                finally:
                    m.leave(rid)
                if attempt.finish in (None, "abort") and flight.retry and not flight.aborted.is_set():
                    if flight.keep:
                        if len(attempt.out_ids) < request.sampling.max_tokens:
                            log.info(
                                "generation_continued_after_weight_update",
                                request_id=rid,
                                kept_tokens=len(attempt.out_ids),
                            )
                            telemetry.WEIGHT_UPDATE_TOKENS.labels(m.name, "resubmitted").inc(
                                len(attempt.out_ids)
                            )
                            attempt.finish = None
                            continue
                        attempt.finish = "length"  # the abort came after the last id it may produce
                    elif not attempt.streamed:
                        log.info("generation_retried_after_weight_update", request_id=rid)
                        telemetry.WEIGHT_UPDATE_TOKENS.labels(m.name, "discarded").inc(len(attempt.out_ids))
                        continue
                    else:
                        attempt.finish = "abort"
                break
            if attempt.finish is None:
                if not flight.aborted.is_set():
                    raise errors.BackendDown(
                        f"model {m.name!r} ended generation {rid} without a finish reason", retry_after_s=1.0
                    )
                attempt.finish = "abort"
            result = self._finish(m, inp, request, reused, attempt)
            telemetry.finished(
                m.name,
                result.finish_reason,
                result.usage.prompt_tokens,
                result.usage.completion_tokens,
                time.perf_counter() - arrived,
            )
            yield result
        finally:
            del self._flights[rid]

    @staticmethod
    def _continued(request: EngineRequest, attempt: _Attempt) -> EngineRequest:
        """`request` as it goes on from `attempt`'s output ids (CONTINUE): they join the prompt,
        and max_tokens is what is left."""
        if not attempt.out_ids:
            return request
        sampling = dataclasses.replace(
            request.sampling, max_tokens=request.sampling.max_tokens - len(attempt.out_ids)
        )
        prompt = (*request.prompt_token_ids, *attempt.out_ids)
        return dataclasses.replace(request, prompt_token_ids=prompt, sampling=sampling)

    async def _run_engine(
        self, m: _Model, request: EngineRequest, attempt: _Attempt, deadline: float | None
    ) -> AsyncGenerator[StreamDelta, None]:
        """One engine request: deltas out, the outcome recorded in `attempt`."""
        rid = request.request_id
        # The replica call's span: not made current, since this generator yields.
        engine_span = tracing.start("gateway.replica", {"rollmesh.model": m.name})
        if engine_span is not None:  # a replica in another process continues the trace from it
            request = dataclasses.replace(request, trace_context=tracing.carrier_for(engine_span))
        agen = m.backend.generate(request)
        error: BaseException | None = None
        across = _StopAcross.of(m, request, attempt)
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        chunk = await anext(agen)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise errors.GenerationDeadlineExceeded(
                        f"generation {rid} did not finish before the deadline ({len(attempt.out_ids)} tokens "
                        "generated)",
                        metadata={"request_id": rid},
                    ) from None
                except errors.BackendUnavailable as exc:
                    raise errors.BackendDown(
                        f"model {m.name!r} is unavailable: {exc}",
                        retry_after_s=exc.retry_after_s,
                        metadata={"model": m.name},
                    ) from None
                if chunk.replica_id and chunk.replica_id != attempt.replica:
                    # The backend may move a request to another replica before any output (failover,
                    # a replica on stale weights): the result names the replica that produced it.
                    if attempt.replica:
                        _leave_replica(m, attempt.replica)
                    attempt.replica = chunk.replica_id
                    m.in_flight[attempt.replica] += 1
                if chunk.prompt_token_ids and not attempt.prompt_ids:
                    attempt.prompt_ids = chunk.prompt_token_ids
                if chunk.prompt_tokens or chunk.completion_tokens:
                    attempt.reported_usage = (chunk.prompt_tokens, chunk.completion_tokens)
                if chunk.token_ids or chunk.text:
                    if not attempt.out_ids and not attempt.texts:
                        attempt.first_token_s = time.perf_counter() - attempt.arrived
                        telemetry.FIRST_TOKEN_SECONDS.labels(m.name).observe(attempt.first_token_s)
                    attempt.out_ids.extend(chunk.token_ids)
                    attempt.logprobs.extend(chunk.logprobs)
                    attempt.texts.append(chunk.text)
                    if across is not None and (cut := across.check(attempt.out_ids)) is not None:
                        kept = len(chunk.token_ids) - (len(attempt.out_ids) - cut)
                        del attempt.out_ids[cut:], attempt.logprobs[cut:]
                        attempt.finish = "stop"
                        await m.backend.abort(rid)  # the engine did not see the stop string: end it
                        yield StreamDelta("", chunk.token_ids[:kept], chunk.logprobs[:kept])
                        break
                    yield StreamDelta(chunk.text, chunk.token_ids, chunk.logprobs)
                if chunk.finish_reason:
                    attempt.finish = chunk.finish_reason
                    break
        except BaseException as exc:
            error = exc
            raise
        finally:
            tracing.end(
                engine_span,
                {"rollmesh.replica_id": attempt.replica, "rollmesh.finish_reason": attempt.finish or ""},
                error if isinstance(error, Exception) else None,
            )
            if attempt.replica:
                _leave_replica(m, attempt.replica)
            if attempt.finish is None:
                await m.backend.abort(rid)
            aclose = getattr(agen, "aclose", None)
            if aclose is not None:
                await aclose()

    def _finish(
        self,
        m: _Model,
        inp: GenerateInput,
        request: EngineRequest,
        reused: int,
        attempt: _Attempt,
    ) -> GenerateResult:
        rid = request.request_id
        finish = attempt.finish or "abort"
        out_ids = attempt.out_ids
        tokenizer = m.backend.tokenizer if m.backend.supports_token_ids else None
        if tokenizer is not None and out_ids:
            # Decode ourselves, keeping special tokens such as <tool_call>, minus a trailing eos.
            eos = getattr(tokenizer, "eos_token_id", None)
            body = out_ids[:-1] if out_ids[-1] == eos else out_ids
            raw = tokenizer.decode(body, skip_special_tokens=False)
            if finish == "stop" and body is out_ids and request.sampling.stop:
                last_from = len(tokenizer.decode(body[:-1], skip_special_tokens=False))
                raw = before_stop_string(raw, request.sampling.stop, last_from)
        else:
            raw = "".join(attempt.texts)
        parsed = parse_tool_calls(raw, id_prefix=call_id_prefix(rid))
        if parsed.tool_calls and finish == "stop":  # a turn cut by length (or unknown) keeps saying so
            finish = "tool_calls"
        message = Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls)
        if inp.session_id and finish != "abort":
            self.sessions.put(
                SessionState(
                    session_id=inp.session_id,
                    model=m.name,
                    tools_key=tools_key(inp.tools),
                    messages=(*inp.messages, message) if inp.messages and tokenizer is not None else (),
                    token_ids=(*attempt.prompt_ids, *out_ids) if tokenizer is not None else (),
                    replica_id=attempt.replica,
                )
            )
        return GenerateResult(
            message=message,
            prompt_token_ids=tuple(attempt.prompt_ids),
            output_token_ids=tuple(out_ids),
            logprobs=tuple(attempt.logprobs) if request.sampling.logprobs else (),
            finish_reason=finish,
            usage=Usage(  # the backend's counts when it reported no ids (message-only backends)
                prompt_tokens=len(attempt.prompt_ids) or attempt.reported_usage[0],
                completion_tokens=len(out_ids) or attempt.reported_usage[1],
            ),
            replica_id=attempt.replica,
            policy_version=attempt.version,
            versions=spans_of_starts(attempt.starts, len(out_ids)),
            model=m.name,
            request_id=rid,
            reused_prefix_tokens=reused,
            first_token_s=round(attempt.first_token_s, 6),
        )
