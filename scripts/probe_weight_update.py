"""Probe: which vLLM (0.32, CPU build) API replaces the weights of a running `AsyncLLM`.

Run standalone (`python scripts/probe_weight_update.py`); prints one JSON line per finding.
Contract: loads the shipped tiny-arith model in one engine, then tries
  1. the weight-transfer API (`start_weight_update` / `update_weights` / `finish_weight_update`),
  2. `collective_rpc("reload_weights", kwargs={"weights_path": ...})` with a perturbed checkpoint,
     comparing greedy output with HF transformers on the same checkpoint,
  3. `reload_weights` with a checkpoint missing a tensor (does vLLM refuse, or half-load?).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = Path(__file__).resolve().parents[1] / "services/rollmesh/builtin/models/tiny-arith"


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _perturbed_checkpoint(target: Path, *, drop: str = "") -> None:
    import torch
    from safetensors.torch import load_file
    from safetensors.torch import save_file

    shutil.copytree(MODEL, target, dirs_exist_ok=True)
    tensors = load_file(str(MODEL / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in tensors.items() if k != drop}
    save_file(new, str(target / "model.safetensors"), metadata={"format": "pt"})


def _hf_greedy(path: Path, prompt: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return [int(t) for t in out[0, len(prompt) :]]


def _prompt() -> list[int]:
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(MODEL))
    ids: Any = tok.apply_chat_template(
        [{"role": "user", "content": "What is 17 + 25?"}], add_generation_prompt=True
    )
    return [int(i) for i in (ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)]


async def _greedy(engine: Any, tag: str, n: int = 12) -> list[int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=n)
    final: Any = None
    async for out in engine.generate(TokensPrompt(prompt_token_ids=PROMPT), params, f"probe-{tag}"):
        final = out
    return [int(t) for t in final.outputs[0].token_ids]


PROMPT: list[int] = []


async def _main() -> None:
    PROMPT.extend(_prompt())
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.monotonic()
    args = AsyncEngineArgs(
        model=str(MODEL), dtype="float32", max_model_len=256, seed=0, enable_prefix_caching=True
    )
    engine = AsyncLLM.from_engine_args(args)
    _say(step="engine_ready", seconds=round(time.monotonic() - t0, 1))
    before = await _greedy(engine, "before")
    _say(step="greedy_before", tokens=before, hf=_hf_greedy(MODEL, PROMPT, 12))

    try:
        await engine.start_weight_update()
        _say(step="weight_transfer_api", ok=True)
        await engine.finish_weight_update(weight_version="probe")
    except Exception as exc:
        _say(step="weight_transfer_api", ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")

    with tempfile.TemporaryDirectory() as tmp:
        new = Path(tmp) / "new"
        _perturbed_checkpoint(new)
        t1 = time.monotonic()
        try:
            await engine.collective_rpc("reload_weights", kwargs={"weights_path": str(new)})
            after = await _greedy(engine, "after")
            hf = _hf_greedy(new, PROMPT, 12)
            _say(
                step="reload_weights",
                ok=True,
                seconds=round(time.monotonic() - t1, 2),
                tokens=after,
                hf=hf,
                matches_hf=after == hf,
                changed=after != before,
            )
        except Exception as exc:
            _say(step="reload_weights", ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")

        bad = Path(tmp) / "bad"
        _perturbed_checkpoint(bad, drop="model.layers.1.mlp.down_proj.weight")
        try:
            await engine.collective_rpc("reload_weights", kwargs={"weights_path": str(bad)})
            _say(step="reload_missing_tensor", raised=False, tokens=await _greedy(engine, "bad"))
        except Exception as exc:
            _say(step="reload_missing_tensor", raised=True, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        try:
            _say(step="after_bad", tokens=await _greedy(engine, "after-bad"))
        except Exception as exc:
            _say(step="after_bad", error=f"{type(exc).__name__}: {str(exc)[:300]}")
    engine.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    asyncio.run(_main())
