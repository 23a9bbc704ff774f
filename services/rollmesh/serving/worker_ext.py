"""A vLLM worker extension (`worker_extension_cls`) for live weight updates.

Contract: `rollmesh_reload_weights(weights_path)` runs in every worker of a replica's engine: the
worker's own `reload_weights(weights_path=...)`, then, for a model with tied input and output
embeddings, makes `lm_head` use the reloaded `embed_tokens` weight. vLLM 0.32's layerwise reload
processes only layers that received tensors; a tied `lm_head` receives none, so on CPU its GEMM
keeps a copy of the old weight prepacked at load (measured: the replica then generates exactly what
HF gives for "new body + old output projection"). The extension re-ties the parameter if the
reload replaced it and dispatches the CPU GEMM again.
"""

from __future__ import annotations

from typing import Any


class WeightReloadExtension:
    """Mixed into vLLM's worker class: `self` is the worker."""

    def rollmesh_reload_weights(self, weights_path: str) -> bool:
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        model = worker.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        if not tied or lm_head is None or embed is None:
            return False
        if lm_head.weight is not embed.weight:
            lm_head.weight = embed.weight
        if hasattr(lm_head, "cpu_linear"):
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

            dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
        return True
