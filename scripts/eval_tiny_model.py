#!/usr/bin/env python3
"""Evaluate the shipped tiny model with real vLLM on CPU, offline.

Runs the held-out ``arithmetic`` benchmark (``datasets/arithmetic/test.jsonl``) through
``vllm.LLM.chat`` with the model's own chat template and reports:

- greedy accuracy (temperature 0),
- pass@1 (mean over samples) and unbiased pass@k at temperature 1.0, k samples per task,
- vLLM load time and generation throughput (output tokens/s),

then records them in the model's README.md (between the ``eval`` markers).

Usage::

    python scripts/eval_tiny_model.py [--model services/rollmesh/builtin/models/tiny-arith]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BUILTIN = REPO / "services" / "rollmesh" / "builtin"
DEFAULT_MODEL = BUILTIN / "models" / "tiny-arith"
DEFAULT_DATA = BUILTIN / "datasets" / "arithmetic" / "test.jsonl"

# vLLM on CPU, offline. Set before vllm is imported.
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; the default (0 → 4 GiB) is far too much here
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
# Engine kwargs that work for this model on vllm-cpu.
ENGINE_KWARGS: dict[str, Any] = {
    "max_model_len": 256,
    "enforce_eager": True,
    "seed": 0,
}


def extract_answer(text: str) -> str | None:
    """The answer as the `arithmetic` environment reads it (its last number, read whole), so the
    model card's figures are the ones a rollmesh job scores."""
    from rollmesh.builtin.environments.arithmetic.env import last_integer

    return last_integer(text)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021) from n samples with c correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def load_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def update_readme(model_dir: Path, figures: dict[str, Any]) -> None:
    readme = model_dir / "README.md"
    if not readme.exists():
        return
    text = readme.read_text()
    begin, end = "<!-- eval:begin -->", "<!-- eval:end -->"
    if begin not in text or end not in text:
        return
    k = figures["k"]
    greedy_tps, sampled_tps = figures["greedy_tokens_per_s"], figures["sampled_tokens_per_s"]
    engine = ", ".join(f"`{key}={value!r}`" for key, value in ENGINE_KWARGS.items())
    env = ", ".join(f"`{key}={value}`" for key, value in VLLM_ENV.items())
    block = f"""{begin}
Measured by `scripts/eval_tiny_model.py` with vllm-cpu {figures["vllm_version"]} (`vllm.LLM.chat`,
the model's chat template) on the {figures["n_tasks"]} held-out rows of
`datasets/arithmetic/test.jsonl`, on a {figures["cpu_count"]}-core CPU machine. A response
is correct when its last integer equals `expected_answer`.

| figure | value |
|---|---|
| greedy accuracy (temperature 0) | {figures["greedy_acc"]:.3f} |
| pass@1 at temperature 1.0 (mean over {k} samples) | {figures["pass_at_1"]:.3f} |
| pass@{k} at temperature 1.0 (unbiased) | {figures["pass_at_k"]:.3f} |
| vLLM load time (`LLM(...)` constructor) | {figures["load_seconds"]:.1f} s |
| greedy generation throughput | {greedy_tps:.0f} output tokens/s ({figures["greedy_seconds"]:.2f} s) |
| sampled generation throughput | {sampled_tps:.0f} output tokens/s ({figures["sampled_seconds"]:.2f} s) |

Engine settings: `dtype="{figures["dtype"]}"`, {engine};
environment {env}.
{end}"""
    start = text.index(begin)
    stop = text.index(end) + len(end)
    readme.write_text(text[:start] + block + text[stop:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--no-readme", action="store_true", help="do not write the figures into README.md")
    args = parser.parse_args(argv)

    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)

    import vllm
    from vllm import LLM
    from vllm import SamplingParams

    model_dir: Path = args.model.resolve()
    rows = load_rows(args.data)
    conversations = [row["responses_create_params"]["input"] for row in rows]
    expected = [str(row["expected_answer"]) for row in rows]

    t0 = time.monotonic()
    llm = LLM(model=str(model_dir), dtype=args.dtype, **ENGINE_KWARGS)
    load_seconds = time.monotonic() - t0
    tokenizer = llm.get_tokenizer()

    # Greedy.
    t0 = time.monotonic()
    greedy = llm.chat(
        conversations, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False
    )
    greedy_seconds = time.monotonic() - t0
    greedy_tokens = sum(len(o.outputs[0].token_ids) for o in greedy)
    greedy_correct = [
        extract_answer(o.outputs[0].text) == exp for o, exp in zip(greedy, expected, strict=True)
    ]

    # The prompt vLLM built is exactly the HF chat template's rendering, and the
    # tokenizer decodes generated ids back to the exact text vLLM returned.
    for conv, out in zip(conversations[:20], greedy[:20], strict=True):
        rendered = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert isinstance(rendered, str)
        assert list(out.prompt_token_ids or []) == tokenizer.encode(rendered, add_special_tokens=False), (
            rendered
        )
        completion = out.outputs[0]
        assert tokenizer.decode(list(completion.token_ids), skip_special_tokens=True) == completion.text
    for conv, out in list(zip(conversations, greedy, strict=True))[:5]:
        print(f"greedy: {conv[0]['content']!r} -> {out.outputs[0].text!r} ({out.outputs[0].finish_reason})")

    # Temperature 1.0, k samples per task (one seeded request per task).
    t0 = time.monotonic()
    sampled = llm.chat(
        conversations,
        [
            SamplingParams(n=args.k, temperature=1.0, max_tokens=args.max_tokens, seed=i)
            for i in range(len(rows))
        ],
        use_tqdm=False,
    )
    sampled_seconds = time.monotonic() - t0
    sampled_tokens = sum(len(c.token_ids) for o in sampled for c in o.outputs)
    p1: list[float] = []
    pk: list[float] = []
    for out, exp in zip(sampled, expected, strict=True):
        n = len(out.outputs)
        c = sum(extract_answer(comp.text) == exp for comp in out.outputs)
        p1.append(c / n)
        pk.append(pass_at_k(n, c, args.k))

    figures: dict[str, Any] = {
        "model": str(model_dir),
        "vllm_version": vllm.__version__,
        "dtype": args.dtype,
        "n_tasks": len(rows),
        "k": args.k,
        "greedy_acc": sum(greedy_correct) / len(rows),
        "pass_at_1": sum(p1) / len(p1),
        "pass_at_k": sum(pk) / len(pk),
        "load_seconds": load_seconds,
        "greedy_seconds": greedy_seconds,
        "greedy_tokens_per_s": greedy_tokens / greedy_seconds,
        "sampled_seconds": sampled_seconds,
        "sampled_tokens_per_s": sampled_tokens / sampled_seconds,
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(figures, indent=2))
    if not args.no_readme:
        update_readme(model_dir, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
