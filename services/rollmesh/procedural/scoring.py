"""Scoring an answer with the generator's own scorer (runs in a verifier worker process).

Which text is the answer (`READINGS`; the environment picks one):
- `final` (rollmesh's, the default): the final assistant message, outside its think blocks
  (`<think>…</think>` or `<thinking>…</thinking>`; text before a lone `</think>` and after an
  unclosed `<think>` is thinking too); in it the last `<answer>…</answer>`
  (reasoning_gym.utils.extract_answer), else the last `\\boxed{…}` (answer_text.last_box), else the whole
  of it. An `<answer>` inside a think block, an earlier assistant message, or a first box that a
  later one corrects is never the answer.
- `nemo_gym` (NeMo Gym's reasoning_gym server, for re-scoring its rows as it did): every
  assistant message joined, think blocks included; the last `<answer>…</answer>`, else the first
  `\\boxed{…}` (up to its first `}`), else the whole text.

The entry handed to the scorer is the row's question, answer and metadata, or, when the row
says its metadata does not survive JSON (`reasoning_gym_entry.rebuild`), the entry made again
from its generator, config and index (and checked to ask the row's question).

A scorer that raises is a wrong answer: score 0 with the exception as the reason, never an error.
What cannot be scored at all (no generator named, an unknown one, an entry that cannot be trusted)
comes back as `{"bad_task": why}`, which the environment raises as BadTask.

One generator's scorer is wrong and is replaced: game_of_life_halting compares `bool(answer)` with
`bool(gold)`, and the gold is the string "True" or "False", so any non-empty answer scores 1.0;
here its answer must say the gold word (case and surrounding space ignored).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from rollmesh.mesh.answer_text import last_box
from rollmesh.mesh.answer_text import outside_think
from rollmesh.mesh.errors import RollmeshError
from rollmesh.procedural.rows import NOT_JSON_SAFE
from rollmesh.procedural.rows import SOURCE_FIELD
from rollmesh.procedural.rows import check_names
from rollmesh.procedural.rows import rebuild_entry

Json = dict[str, Any]
READINGS = ("final", "nemo_gym")
_FIRST_BOXED = re.compile(r"\\boxed\{([^}]+)\}")  # NeMo Gym's: up to the first `}`


def extract(text: str, reading: str = "final") -> str:
    """The answer in a completion's text, read as `reading` says (module docstring)."""
    from reasoning_gym.utils import extract_answer

    if reading == "nemo_gym":
        tagged = extract_answer(text, tag_name="answer")
        if tagged is not None:
            return str(tagged)
        first = _FIRST_BOXED.search(text)
        return first.group(1).strip() if first else text.strip()
    region = outside_think(text)
    tagged = extract_answer(region, tag_name="answer")
    if tagged is not None:
        return str(tagged)
    box = last_box(region)
    return region[box[1] : box[2]].strip() if box is not None else region.strip()


def warmup() -> bool:
    import reasoning_gym  # noqa: F401  (every generator module: ~2 s the first time)

    return True


def entry_of(row: Mapping[str, Any]) -> tuple[str, Json]:
    """(generator, the entry its scorer gets) for a row; raises a RollmeshError when it cannot."""
    from rollmesh.procedural.errors import EntryMismatch

    metadata = row.get("metadata")
    source = row.get(SOURCE_FIELD)
    name = metadata.get("source_dataset") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) and isinstance(source, Mapping):
        name = source.get("generator")
    if not isinstance(name, str) or not name:
        raise EntryMismatch("the row names no generator (metadata.source_dataset)")
    check_names((name,))
    if not isinstance(metadata, Mapping):
        raise EntryMismatch(f"the row's metadata must be an object, not {type(metadata).__name__}")
    entry: Json = {"question": row.get("question"), "answer": row.get("answer"), "metadata": metadata}
    if isinstance(source, Mapping) and source.get("rebuild"):
        made = rebuild_entry(source)
        if made.get("question") != row.get("question"):
            raise EntryMismatch(
                f"{name} entry {source.get('index')} asks another question today than the row does "
                "(written by another reasoning-gym version?); regenerate the dataset"
            )
        entry = made
    elif name in NOT_JSON_SAFE:
        raise EntryMismatch(
            f"a {name} row keeps tuples in metadata that JSON turned into lists, so its scorer would "
            f"misjudge even the gold answer, and it has no {SOURCE_FIELD} to make the entry again; "
            "write it with `rollmesh datasets generate`"
        )
    return name, entry


def _scorer(name: str) -> Any:
    import reasoning_gym

    if name == "game_of_life_halting":
        return _halting_score
    return reasoning_gym.get_score_answer_fn(name)


def _halting_score(answer: str | None, entry: Mapping[str, Any]) -> float:
    gold = str(entry.get("answer", "")).strip().lower()
    return 1.0 if answer is not None and answer.strip().lower() == gold else 0.0


def score(row: Json, text: str, reading: str = "final") -> Json:
    """{score, extracted, reason, generator} for `text` as the answer to `row` (read as `reading`
    says), or {bad_task: why}."""
    try:
        name, entry = entry_of(row)
    except RollmeshError as exc:
        return {"bad_task": exc.message}
    extracted = extract(text, reading)
    if not extracted:
        return {"score": 0.0, "extracted": "", "reason": "no answer", "generator": name}
    try:
        value = float(_scorer(name)(answer=extracted, entry=entry))
    except Exception as exc:  # the generator's scorer refused the answer: a wrong answer
        why = f"scorer raised {type(exc).__name__}: {exc}"
        return {"score": 0.0, "extracted": extracted, "reason": why, "generator": name}
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return {"bad_task": f"the {name} scorer gave {value!r}, not a score in [0, 1]"}
    return {"score": value, "extracted": extracted, "reason": "scored by " + name, "generator": name}
