#!/usr/bin/env python3
"""Train the shipped tiny model ``tiny-arith`` from scratch, offline, on one CPU core.

What it does, deterministically:

1. Builds the ``arithmetic`` task data (``What is {a} + {b}?`` → ``The answer is {a+b}.``)
   for ``a, b`` in ``0..99``, holding out the pairs for which
   ``rollmesh.builtin.datasets.arithmetic_split.is_heldout`` is true. It writes the
   held-out benchmark rows (``datasets/arithmetic/test.jsonl``, 200 NeMo Gym rows) and
   ``example.jsonl`` (the first 10). Held-out pairs that are not benchmark rows are the
   validation set used for early stopping; no held-out pair is ever trained on.
1b. Builds reasoning-gym rows of the ``reasoning_gym_arith`` spec's generators and configs
   (basic_arithmetic, natural phrasing, and chain_sum; two terms of at most two digits),
   made by reasoning-gym itself under seeds millions away from the spec's, answered in
   reasoning-gym's convention (``<answer>{answer}</answer>``, as the ``reasoning_gym``
   environment extracts it). A row whose pair is held out (the rule above, or a pair of the
   benchmark's rows) is never trained on; held-out pairs that are not the benchmark's are
   the reasoning-gym validation set. A row that asks ``What is {a} + {b}?`` (the
   ``arithmetic`` task's own question) is trained as the ``arithmetic`` task, not twice.
2. Trains a byte-level BPE tokenizer in which every digit is its own token.
3. Attaches a chat template (system/user/assistant/tool roles, tools, tool calls).
4. Trains a 2-layer Llama (``LlamaForCausalLM``) with loss on assistant tokens only,
   stopping once held-out greedy accuracy reaches ``--target-acc`` or the time budget
   runs out, and saves it (safetensors) plus tokenizer and README into ``--out``.

Usage::

    python scripts/train_tiny_model.py --out services/rollmesh/builtin/models/tiny-arith
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BUILTIN = REPO / "services" / "rollmesh" / "builtin"
DATASET_DIR = BUILTIN / "datasets" / "arithmetic"
SPLIT_MODULE = BUILTIN / "datasets" / "arithmetic_split.py"
RG_SPEC = BUILTIN / "datasets" / "reasoning_gym_arith" / "reasoning_gym.json"
# reasoning-gym draws entry i from Random(seed + i): millions away from the spec's seed (and from
# examples/grpo_arith.py's training split, a million away), the per-entry seeds never meet.
RG_TRAIN_SEED_OFFSET = 5_000_000
RG_VAL_SEED_OFFSET = 7_000_000
RG_VAL_DRAWN = 4000  # rows drawn for validation; only those with a held-out pair are kept

SEED = 1234
N_TEST = 200
N_EXAMPLE = 10
MAX_LEN = 256

BOS = "<|bos|>"
EOS = "<|eos|>"
PAD = "<|pad|>"
END = "<|end|>"  # end of a message; the generation stop (tokenizer eos_token)
SPECIAL_TOKENS = [
    BOS,
    EOS,
    PAD,
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    END,
    "<tool_call>",
    "</tool_call>",
]

# Roles: system, user, assistant, tool. Each message is "<|role|>\n{content}<|end|>\n".
# Tools (if any) go into one leading system block as JSON, merged with a leading system
# message. Assistant tool calls follow the content as
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>; arguments may be a dict or an
# OpenAI-style JSON string. Content may be a string or a list of {"type": "text"} parts.
CHAT_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}"
    "{%- if part is string -%}{{- part -}}"
    "{%- elif part.text is defined and part.text is not none -%}{{- part.text -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- set first_is_system = messages | length > 0 and messages[0].role == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|system|>\\n' -}}"
    "{%- if first_is_system -%}{{- render_content(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- 'You can call these tools:\\n' -}}"
    "{%- for tool in tools -%}"
    "{{- (tool.function if tool.function is defined else tool) | tojson -}}{{- '\\n' -}}"
    "{%- endfor -%}"
    '{{- \'To call a tool, write <tool_call>{"name": ..., "arguments": {...}}</tool_call>.\' -}}'
    "{{- '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- if not (tools and loop.first) -%}"
    "{{- '<|system|>\\n' + render_content(message.content) + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif message.role == 'user' -%}"
    "{{- '<|user|>\\n' + render_content(message.content) + '<|end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|assistant|>\\n' -}}"
    "{%- if message.content is defined and message.content is not none -%}"
    "{{- render_content(message.content) -}}"
    "{%- endif -%}"
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if fn.arguments is string -%}"
    "{{- '<tool_call>{\"name\": ' + fn.name | tojson + ', \"arguments\": ' -}}"
    "{{- fn.arguments + '}</tool_call>' -}}"
    "{%- else -%}"
    "{{- '<tool_call>{\"name\": ' + fn.name | tojson + ', \"arguments\": ' -}}"
    "{{- fn.arguments | tojson + '}</tool_call>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|tool|>\\n' + render_content(message.content) + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a careful calculator. Answer briefly.",
    "Solve the problem.",
    "You are rollmesh's tiny arithmetic model.",
]

WORDS = (
    "the of and to in is was for on that with as by at from it an be this are or which "
    "answer question what how many much sum total add plus result number value tool call "
    "function arguments name city weather temperature unit celsius fahrenheit time date "
    "today tomorrow search query results page file path read write list item items count "
    "user assistant system message content role please thanks hello world model data set "
    "test train reward score pass fail error status ok true false null none yes no we you "
    "they he she its their our your get set make take give find use run check compute "
    "calculate return send open close start stop first last next previous small large "
    "good bad new old high low left right up down in out over under before after because "
    "if then else when where why who all any some each every more most less few other "
    "same different number string object array integer boolean description required type "
    "properties parameters location query limit offset id key token step session state"
).split()

TOOL_NAMES = [
    "get_weather",
    "calculator",
    "search",
    "lookup",
    "get_time",
    "read_file",
    "add",
    "multiply",
    "submit_answer",
    "run_python",
]


def load_split() -> ModuleType:
    """Import ``arithmetic_split`` by path (it needs no installed package)."""
    spec = importlib.util.spec_from_file_location("arithmetic_split", SPLIT_MODULE)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {SPLIT_MODULE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Splits:
    train: list[tuple[int, int]]
    val: list[tuple[int, int]]
    test: list[tuple[int, int]]


def make_splits(split: ModuleType) -> Splits:
    pairs = [(a, b) for a in range(100) for b in range(100)]
    heldout = [p for p in pairs if split.is_heldout(*p)]
    train = [p for p in pairs if not split.is_heldout(*p)]
    test = random.Random(SEED).sample(heldout, N_TEST)
    test_set = set(test)
    val = [p for p in heldout if p not in test_set]
    assert not set(train) & set(heldout)
    return Splits(train=train, val=val, test=test)


@dataclass(frozen=True)
class RgItem:
    question: str
    answer: str  # reasoning-gym's gold answer
    pair: tuple[int, int]


@dataclass(frozen=True)
class RgSplits:
    benchmark: list[RgItem]  # the reasoning_gym_arith benchmark's rows (held out)
    train: list[RgItem]
    val: list[RgItem]


def rg_item(row: dict[str, Any]) -> RgItem:
    """A reasoning-gym row of two terms (``metadata.expression`` is ``A + B`` or ``A - B``)."""
    left, _op, right = str(row["metadata"]["expression"]).split()
    return RgItem(question=str(row["question"]), answer=str(row["answer"]), pair=(int(left), int(right)))


def rg_answer(answer: str) -> str:
    """reasoning-gym's convention, as the ``reasoning_gym`` environment extracts the answer."""
    return f"<answer>{answer}</answer>"


def make_rg_splits(split: ModuleType, train_rows: int) -> RgSplits:
    from dataclasses import replace

    from rollmesh.procedural import ProceduralSpec
    from rollmesh.procedural.rows import generate_rows

    spec = ProceduralSpec.from_json(json.loads(RG_SPEC.read_text()), where=str(RG_SPEC))
    benchmark = [rg_item(row) for row in generate_rows(spec)]
    bench_pairs = {item.pair for item in benchmark}

    def heldout(item: RgItem) -> bool:
        return bool(split.is_heldout(*item.pair)) or item.pair in bench_pairs

    def arithmetic_question(item: RgItem) -> bool:
        return item.question == user_message(*item.pair)

    drawn = [
        rg_item(r)
        for r in generate_rows(replace(spec, size=train_rows, seed=spec.seed + RG_TRAIN_SEED_OFFSET))
    ]
    train = [it for it in drawn if not heldout(it) and not arithmetic_question(it)]
    drawn = [
        rg_item(r)
        for r in generate_rows(replace(spec, size=RG_VAL_DRAWN, seed=spec.seed + RG_VAL_SEED_OFFSET))
    ]
    val = [it for it in drawn if heldout(it) and it.pair not in bench_pairs and not arithmetic_question(it)]
    assert not {it.pair for it in train} & ({it.pair for it in val} | bench_pairs)
    return RgSplits(benchmark=benchmark, train=train, val=val)


def user_message(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def assistant_message(a: int, b: int) -> str:
    return f"The answer is {a + b}."


def write_datasets(test: Sequence[tuple[int, int]]) -> None:
    DATASET_DIR.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (a, b) in enumerate(test):
        row = {
            "responses_create_params": {"input": [{"role": "user", "content": user_message(a, b)}]},
            "expected_answer": str(a + b),
            "task_id": f"arith-{i:04d}",
        }
        lines.append(json.dumps(row) + "\n")
    (DATASET_DIR / "test.jsonl").write_text("".join(lines))
    (DATASET_DIR / "example.jsonl").write_text("".join(lines[:N_EXAMPLE]))


# ----------------------------------------------------------------------------- tokenizer


def synthetic_corpus(rng: random.Random, n: int) -> list[str]:
    """General English-ish text, tool schemas, tool calls and tool results."""
    out: list[str] = []
    for _ in range(n):
        kind = rng.randrange(5)
        if kind == 0:
            words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
            sentence = " ".join(words)
            out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ":"]))
        elif kind == 1:
            args = {rng.choice(WORDS): rng.choice([rng.choice(WORDS), rng.randint(0, 999)]) for _ in range(2)}
            call = {"name": rng.choice(TOOL_NAMES), "arguments": args}
            out.append(f"<tool_call>{json.dumps(call)}</tool_call>")
        elif kind == 2:
            result = {rng.choice(WORDS): rng.choice([rng.choice(WORDS), rng.randint(-50, 5000), True, None])}
            out.append(json.dumps(result))
        elif kind == 3:
            schema = {
                "type": "function",
                "function": {
                    "name": rng.choice(TOOL_NAMES),
                    "description": " ".join(rng.choice(WORDS) for _ in range(6)),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            rng.choice(WORDS): {"type": rng.choice(["string", "integer", "number"])}
                        },
                        "required": [rng.choice(WORDS)],
                    },
                },
            }
            out.append(json.dumps(schema))
        else:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            out.append(f"{a} {rng.choice(['+', '-', '*', '/', '='])} {b} = {rng.randint(0, 99999)}; x_{a}.y")
    return out


def train_tokenizer(texts: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer
    from tokenizers import decoders
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build_hf_tokenizer(raw: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    fast_cls: Any = PreTrainedTokenizerFast  # untyped constructor
    hf = fast_cls(
        tokenizer_object=raw,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        unk_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (BOS, END, PAD)],
        model_max_length=MAX_LEN,
        clean_up_tokenization_spaces=False,
        padding_side="right",
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(hf: Any, out: Path) -> None:
    hf.save_pretrained(str(out))
    # Keep the chat template inside tokenizer_config.json (one source of truth).
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config["clean_up_tokenization_spaces"] = False
    # Loadable by the generic fast tokenizer class (an alias of the v5 backend class).
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    jinja = out / "chat_template.jinja"
    if jinja.exists():
        jinja.unlink()


def render(hf: Any, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> str:
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert isinstance(text, str)
    return text


# ----------------------------------------------------------------------------- training data


@dataclass(frozen=True)
class Example:
    ids: list[int]
    labels: list[int]  # -100 where no loss


def task_messages(user: str, system: str | None) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if system is not None:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": user})
    return msgs


def make_example(hf: Any, a: int, b: int, system: str | None) -> Example:
    """An ``arithmetic`` task: ``What is {a} + {b}?`` → ``The answer is {a + b}.``"""
    return make_chat_example(hf, user_message(a, b), assistant_message(a, b), system)


def make_rg_example(hf: Any, item: RgItem) -> Example:
    """A reasoning-gym row as its rows ask it (no system message) → ``<answer>{answer}</answer>``."""
    return make_chat_example(hf, item.question, rg_answer(item.answer), None)


def make_chat_example(hf: Any, user: str, reply: str, system: str | None) -> Example:
    msgs = task_messages(user, system)
    prompt = render(hf, msgs, add_generation_prompt=True)
    full = render(hf, [*msgs, {"role": "assistant", "content": reply}], add_generation_prompt=False)
    assert full.startswith(prompt)
    p_ids = hf.encode(prompt, add_special_tokens=False)
    f_ids = hf.encode(full, add_special_tokens=False)
    assert f_ids[: len(p_ids)] == p_ids, "prompt tokens must be a prefix of the full chat"
    end_id = hf.convert_tokens_to_ids(END)
    last_end = len(f_ids) - 1 - f_ids[::-1].index(end_id)
    labels = [-100] * len(f_ids)
    for i in range(len(p_ids), last_end + 1):
        labels[i] = f_ids[i]
    return Example(ids=f_ids, labels=labels)


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.ids)
        ids[i, :n] = torch.tensor(e.ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def greedy_exact_match(model: Any, examples: Sequence[Example], pad_id: int, batch: int = 256) -> float:
    """Greedy accuracy, computed exactly with one teacher-forced pass per batch.

    Greedy decoding reproduces the reference answer (through ``<|end|>``) iff the argmax
    at every answer position, given the reference prefix, is the reference token.
    """
    import torch

    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(examples), batch):
            b = collate(examples[start : start + batch], pad_id)
            logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            pred = logits[:, :-1].argmax(-1)
            target = b["labels"][:, 1:]
            ok = (pred == target) | (target == -100)
            correct += int(ok.all(dim=1).sum())
    model.train()
    return correct / len(examples)


def write_readme(out: Path, facts: dict[str, Any]) -> None:
    rg_rows = f"{facts['n_rg_train']} (validation {facts['n_rg_val']}, benchmark {facts['n_rg_benchmark']})"
    steps = (
        f"{facts['steps']} (batch {facts['batch_size']}; {facts['rg_fraction']:.0%} of them reasoning-gym's)"
    )
    init = facts["init_from"] or "random weights"
    readme = f"""# tiny-arith

The tiny model that ships with rollmesh: a 2-layer Llama (`LlamaForCausalLM`) trained
from scratch on CPU by `scripts/train_tiny_model.py` to solve the built-in `arithmetic`
environment and, partly, reasoning-gym's easiest sums (the `reasoning_gym_arith` benchmark).
It exists so that the mesh (Ray Serve + vLLM CPU, gateway, scheduler, environments) can run
end to end with a real model, offline, in seconds. It is not a general-purpose model: it only
learned `What is {{a}} + {{b}}?` with `a, b` in `0..99`, and reasoning-gym's basic_arithmetic
(natural phrasing) and chain_sum questions of two terms of at most two digits.

## Task format (fixed)

- user message: `What is {{a}} + {{b}}?` (one user message, no system prompt needed)
- reference answer (`expected_answer`): `str(a + b)`
- the model answers: `The answer is {{a + b}}.` and stops at `<|end|>` (the eos token)
- held-out pairs: `rollmesh/builtin/datasets/arithmetic_split.py::is_heldout(a, b)`
  (~10% of pairs, never trained on). The benchmark rows
  `datasets/arithmetic/test.jsonl` (200) and `example.jsonl` (first 10) are held out.

## reasoning-gym format (fixed)

- user message: a reasoning-gym question as its rows ask it, no system message:
  basic_arithmetic's `Solve {{a}} + {{b}}.`, `Compute {{a}} + {{b}}.`, `Evaluate: {{a}} + {{b}}.` and
  chain_sum's `State the final answer to the following arithmetic problem: {{a}} + {{b}} =`
  (or `-`; the answer can be negative), `a, b` in `0..99`, the configs of
  `datasets/reasoning_gym_arith/reasoning_gym.json`
- the model answers in reasoning-gym's convention, `<answer>{{answer}}</answer>`, and stops at
  `<|end|>`; the `reasoning_gym` environment extracts what is between the tags
- basic_arithmetic's fourth phrasing, `What is {{a}} + {{b}}?`, is the `arithmetic` task's question:
  the model answers it `The answer is {{a + b}}.`, which reasoning-gym's scorer gives partial
  credit, never full credit
- training rows: {facts["n_rg_train"]}, drawn by reasoning-gym from the spec's generators and
  configs under the spec's seed + {RG_TRAIN_SEED_OFFSET:,}, less every row whose pair is held out
  (the rule above, or a pair of the benchmark's rows) and every `What is` row; validation:
  {facts["n_rg_val"]} rows of held-out pairs (seed + {RG_VAL_SEED_OFFSET:,}) that are not the
  benchmark's; the benchmark: the spec's own {facts["n_rg_benchmark"]} rows. No reasoning-gym
  row with a benchmark pair is trained on; the `arithmetic` task (`What is {{a}} + {{b}}?`) trains on
  every pair its own split does not hold out, so most of the benchmark's sums `a + b` were seen in
  that phrasing (never its differences `a - b`). The validation rows' pairs were never trained on
  in any phrasing.

## Architecture

| field | value |
|---|---|
| layers | 2 |
| hidden | 128 |
| heads | 4 (head_dim 32) |
| intermediate | 512 |
| max_position_embeddings | {MAX_LEN} |
| vocab | {facts["vocab_size"]} |
| tied embeddings | yes |
| parameters | {facts["parameters"]:,} |
| dtype | float32 (safetensors) |

## Tokenizer

Byte-level BPE (HF `tokenizers`) with every digit its own token (pre-tokenizer
`Sequence([Digits(individual_digits=True), ByteLevel])`), so any text encodes. Special
tokens: {", ".join(f"`{t}`" for t in SPECIAL_TOKENS)}. `bos_token` is `<|bos|>`,
`eos_token` is `<|end|>` (the generation stop), `pad_token` is `<|pad|>`.

## Chat template

Each message is `<|role|>\\n{{content}}<|end|>\\n` with roles `system`, `user`,
`assistant`, `tool`; the chat starts with `<|bos|>`. `tools` are rendered as JSON in a
leading system block (merged with a leading system message). Assistant tool calls
follow the content as `<tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>`.
`add_generation_prompt` appends `<|assistant|>\\n`. Example:

```
{facts["example_rendering"]}```

## Training

| figure | value |
|---|---|
| training pairs | {facts["n_train"]} (validation {facts["n_val"]}, test {facts["n_test"]}, all held out) |
| reasoning-gym training rows | {rg_rows}, the last two held out |
| started from | {init} |
| steps | {steps} |
| command | `{facts["command"]}` |
| time | {facts["train_seconds"]:.0f} s wall, {facts["train_cpu_seconds"]:.0f} s CPU on 1 thread |
| held-out validation greedy accuracy (teacher-forced exact) | {facts["val_acc"]:.3f} |
| benchmark (test.jsonl) greedy accuracy (teacher-forced exact) | {facts["test_acc"]:.3f} |
| reasoning-gym held-out validation greedy accuracy (teacher-forced exact) | {facts["rg_val_acc"]:.3f} |
| `reasoning_gym_arith` greedy accuracy (teacher-forced; `What is` rows miss) | {facts["rg_bench_acc"]:.3f} |

## Evaluation with vLLM (CPU)

<!-- eval:begin -->
Not evaluated yet: run `python scripts/eval_tiny_model.py`.
<!-- eval:end -->
"""
    (out / "README.md").write_text(readme)


def self_check(hf_dir: Path, model: Any, test_examples: Sequence[Example]) -> str:
    """Round-trip decoding, tool-call chat templating, and a few real greedy generations."""
    import torch
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(hf_dir))
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What is 23 + 45?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": 23, "b": 45}}}
            ],
        },
        {"role": "tool", "content": '{"result": 68}'},
        {"role": "assistant", "content": "The answer is 68."},
    ]
    rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert isinstance(rendered, str)
    encoded = tok.apply_chat_template(messages, tools=tools, tokenize=True)
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    assert ids == tok.encode(rendered, add_special_tokens=False)
    assert tok.decode(ids) == rendered, "decode(encode(chat)) must be exact"
    # OpenAI-style JSON-string arguments render identically.
    openai_msgs = [dict(m) for m in messages]
    openai_msgs[2] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": '{"a": 23, "b": 45}'}}],
    }
    assert tok.apply_chat_template(openai_msgs, tools=tools, tokenize=False) == rendered
    for text in ['héllo wörld ✓ 12345 {"x": [1, 2]}\n\ttabs', "The answer is 168."]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    digits = tok.tokenize("12345")
    assert len(digits) == 5, digits

    # Real autoregressive greedy generation on a few benchmark prompts.
    model.eval()
    end_id = tok.convert_tokens_to_ids(END)
    for ex in test_examples:
        first_label = next(i for i, lab in enumerate(ex.labels) if lab != -100)
        prompt = torch.tensor([ex.ids[:first_label]])
        with torch.no_grad():
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=16,
                do_sample=False,
                eos_token_id=end_id,
                pad_token_id=tok.pad_token_id,
            )
        gen = out[0, prompt.shape[1] :].tolist()
        text = tok.decode(gen, skip_special_tokens=False)
        assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text
        print(f"  generate: {tok.decode(ex.ids[:first_label])!r} -> {text!r}", flush=True)
    return rendered


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=BUILTIN / "models" / "tiny-arith")
    parser.add_argument("--vocab-size", type=int, default=768)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-steps", type=int, default=4000)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--target-acc", type=float, default=0.75, help="arithmetic validation accuracy")
    parser.add_argument("--rg-target-acc", type=float, default=0.75, help="reasoning-gym validation accuracy")
    parser.add_argument(
        "--rg-train-rows", type=int, default=20000, help="reasoning-gym rows drawn for training"
    )
    parser.add_argument("--time-budget-s", type=float, default=28 * 60)
    parser.add_argument("--rg-fraction", type=float, default=0.5, help="share of steps on reasoning-gym rows")
    parser.add_argument("--system-prompt-fraction", type=float, default=0.1)
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start from a model this script saved (e.g. the shipped one) instead of random weights",
    )
    args = parser.parse_args(argv)

    import torch
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    split = load_split()
    rg = make_rg_splits(split, args.rg_train_rows)
    splits = make_splits(split)
    write_datasets(splits.test)
    print(f"pairs: train {len(splits.train)} val {len(splits.val)} test {len(splits.test)}", flush=True)
    print(
        f"reasoning-gym rows: train {len(rg.train)} val {len(rg.val)} benchmark {len(rg.benchmark)}",
        flush=True,
    )

    # Tokenizer corpus: rendered arithmetic training chats + synthetic general text (no
    # reasoning-gym text, so the tokenizer stays the one shipped before reasoning-gym rows).
    corpus: list[str] = []
    for a, b in splits.train:
        corpus.append(
            f"<|user|>\n{user_message(a, b)}<|end|>\n<|assistant|>\n{assistant_message(a, b)}<|end|>\n"
        )
    corpus.extend(SYSTEM_PROMPTS)
    corpus.extend(synthetic_corpus(random.Random(SEED + 1), 20000))
    hf = build_hf_tokenizer(train_tokenizer(corpus, args.vocab_size))
    save_tokenizer(hf, out)
    vocab_size = len(hf)
    pad_id = hf.convert_tokens_to_ids(PAD)
    print(f"tokenizer: vocab {vocab_size}", flush=True)

    def pick_system(r: random.Random) -> str | None:
        return r.choice(SYSTEM_PROMPTS) if r.random() < args.system_prompt_fraction else None

    train_ex = [make_example(hf, a, b, pick_system(rng)) for a, b in splits.train]
    val_ex = [make_example(hf, a, b, None) for a, b in splits.val]
    test_ex = [make_example(hf, a, b, None) for a, b in splits.test]
    rg_train_ex = [make_rg_example(hf, item) for item in rg.train]
    rg_val_ex = [make_rg_example(hf, item) for item in rg.val]
    rg_bench_ex = [make_rg_example(hf, item) for item in rg.benchmark]
    longest = max(len(e.ids) for e in [*train_ex, *rg_train_ex])
    assert longest <= MAX_LEN
    print(f"sequence length: max {longest}", flush=True)

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=MAX_LEN,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=hf.convert_tokens_to_ids(BOS),
        eos_token_id=hf.convert_tokens_to_ids(END),
        pad_token_id=pad_id,
    )
    model_cls: Any = LlamaForCausalLM  # untyped constructor
    if args.init_from is None:
        model = model_cls(config)
    else:  # continue from a model this script trained (same tokenizer, same architecture)
        model = model_cls.from_pretrained(str(args.init_from.resolve()), torch_dtype=torch.float32)
        fields = [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
        ]
        fields += ["head_dim", "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"]
        if any(getattr(model.config, f) != getattr(config, f) for f in fields):
            raise SystemExit(f"--init-from {args.init_from}: not this script's architecture and tokenizer")
        print(f"initialized from {args.init_from}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step: int) -> float:
        if step < args.warmup_steps:
            return float(args.lr * (step + 1) / args.warmup_steps)
        progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
        return float(args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))))

    model.train()
    started = time.monotonic()
    cpu_started = time.process_time()
    # A step's batch comes from one pool, so it pads to that pool's lengths (reasoning-gym
    # questions are up to twice as long as arithmetic ones); --rg-fraction of the steps are
    # reasoning-gym's, spread evenly.
    pools = [train_ex, rg_train_ex]
    orders: list[list[int]] = [[], []]

    def pool_at(step: int) -> int:
        return int(math.floor((step + 1) * args.rg_fraction) > math.floor(step * args.rg_fraction))

    step = 0
    val_acc = rg_val_acc = 0.0
    loss_avg = 0.0
    while step < args.max_steps:
        pool, order = pools[pool_at(step)], orders[pool_at(step)]
        if len(order) < args.batch_size:
            fresh = list(range(len(pool)))
            rng.shuffle(fresh)
            order.extend(fresh)
        idx = order[: args.batch_size]
        del order[: args.batch_size]
        batch = collate([pool[i] for i in idx], pad_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_avg = 0.98 * loss_avg + 0.02 * loss.item() if step > 1 else loss.item()
        elapsed = time.monotonic() - started
        if step % args.eval_every == 0 or elapsed > args.time_budget_s:
            val_acc = greedy_exact_match(model, val_ex, pad_id)
            rg_val_acc = greedy_exact_match(model, rg_val_ex, pad_id)
            print(
                f"step {step} loss {loss_avg:.4f} lr {lr_at(step):.2e} val_acc {val_acc:.3f}"
                f" rg_val_acc {rg_val_acc:.3f} t {elapsed:.0f}s",
                flush=True,
            )
            if val_acc >= args.target_acc and rg_val_acc >= args.rg_target_acc:
                print("target accuracy reached; stopping", flush=True)
                break
            if elapsed > args.time_budget_s:
                print("time budget exhausted; stopping", flush=True)
                break
    train_seconds = time.monotonic() - started
    train_cpu_seconds = time.process_time() - cpu_started
    val_acc = greedy_exact_match(model, val_ex, pad_id)
    test_acc = greedy_exact_match(model, test_ex, pad_id)
    rg_val_acc = greedy_exact_match(model, rg_val_ex, pad_id)
    rg_bench_acc = greedy_exact_match(model, rg_bench_ex, pad_id)
    print(
        f"final: val_acc {val_acc:.3f} test_acc {test_acc:.3f} rg_val_acc {rg_val_acc:.3f}"
        f" rg_benchmark_acc {rg_bench_acc:.3f} steps {step} time {train_seconds:.0f}s",
        flush=True,
    )

    model.generation_config.bos_token_id = config.bos_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = pad_id
    model.save_pretrained(str(out), safe_serialization=True)

    rendered = self_check(out, model, [*test_ex[:5], *rg_bench_ex[:5]])
    write_readme(
        out,
        {
            "vocab_size": vocab_size,
            "parameters": n_params,
            "example_rendering": rendered,
            "n_train": len(splits.train),
            "n_val": len(splits.val),
            "n_test": len(splits.test),
            "steps": step,
            "batch_size": args.batch_size,
            "train_seconds": train_seconds,
            "train_cpu_seconds": train_cpu_seconds,
            "rg_fraction": args.rg_fraction,
            "init_from": None if args.init_from is None else "the weights in " + str(args.init_from),
            "command": "python scripts/train_tiny_model.py "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "val_acc": val_acc,
            "test_acc": test_acc,
            "n_rg_train": len(rg.train),
            "n_rg_val": len(rg.val),
            "n_rg_benchmark": len(rg.benchmark),
            "rg_val_acc": rg_val_acc,
            "rg_bench_acc": rg_bench_acc,
        },
    )
    for f in out.iterdir():
        if f.is_file():
            f.chmod(
                0o644
            )  # save_pretrained writes weights 0600; services in other users/containers read them
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"saved to {out} ({size / 1e6:.2f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
