"""reasoning-gym entries as NeMo Gym-format rows, and entries rebuilt from where they came from.

A row is what NeMo Gym's reasoning_gym create_dataset.py writes and its resources server reads::

    {"responses_create_params": {"input": [{"role": "user", "content": QUESTION}]},
     "question": QUESTION, "answer": ANSWER, "metadata": {"source_dataset": NAME, ...},
     "agent_ref": {...}, "task_id": "NAME/INDEX",
     "reasoning_gym_entry": {"generator": NAME, "config": {...}, "index": INDEX}}

`reasoning_gym_entry` (ours; NeMo Gym ignores it) says how to make the entry again: the
generator, its full config (size and seed included) and the index. Most generators keep tuples
somewhere in `metadata` (JSON turns them into lists), but only two have scorers that then misjudge:
arc_agi and rearc compare the answer's grid with a tuple grid, so their gold answer scores 0.05
after JSON (tests/unit/test_reasoning_gym_generators.py measures this for every generator). Their
rows also say `"rebuild": true`, and the scorer works from the entry made again, never from the
stored metadata.

Everything here imports reasoning-gym: call it off the event loop (generation is CPU work).
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Iterator
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from rollmesh.procedural.errors import EntryMismatch
from rollmesh.procedural.errors import InvalidGeneratorSpec
from rollmesh.procedural.errors import UnknownGenerator
from rollmesh.procedural.spec import GeneratorSpec
from rollmesh.procedural.spec import ProceduralSpec

if TYPE_CHECKING:
    from reasoning_gym.dataset import ProceduralDataset

Json = dict[str, Any]

SOURCE_FIELD = "reasoning_gym_entry"
#: NeMo Gym's agent for these rows (its create_dataset.py writes the same).
AGENT_REF: Json = {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"}
#: Generators whose scorers misjudge after JSON (tuples in metadata become lists): a row of theirs
#: is scored from its entry made again; one without `reasoning_gym_entry` (another tool wrote it) is
#: refused.
NOT_JSON_SAFE = frozenset({"arc_agi", "rearc"})


def known_generators() -> list[str]:
    """Every generator name reasoning-gym registers (its `composite` is a spec's job, not a name)."""
    from reasoning_gym.factory import DATASETS

    return sorted(n for n in DATASETS if n != "composite")


def check_names(names: tuple[str, ...]) -> None:
    known = known_generators()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = (
                f"; did you mean {', '.join(close)}?"
                if close
                else " (rollmesh datasets generators lists them)"
            )
            raise UnknownGenerator(
                f"reasoning-gym has no generator {name!r}{hint}", metadata={"generator": name}
            )


def level_config(g: GeneratorSpec) -> Json:
    """`g.config` with reasoning-gym's curriculum for `g` at `g.level` applied (its attributes'
    fields win), as plain JSON data; `g.config` itself when `g` has no level."""
    if g.level is None:
        return dict(g.config)
    from reasoning_gym.factory import create_curriculum
    from reasoning_gym.factory import has_curriculum

    if not has_curriculum(g.name):
        raise InvalidGeneratorSpec(f"generator {g.name!r} has no curriculum; drop its `level`")
    curriculum = create_curriculum(g.name)
    curriculum.set_global_level(g.level)
    try:
        made = curriculum.generate_configuration(dict(g.config))
    except (TypeError, ValueError, AssertionError) as exc:
        raise InvalidGeneratorSpec(f"{g.name} at level {g.level}: {type(exc).__name__}: {exc}") from None
    fields = set(g.config)
    for attr in curriculum.attributes.values():
        for kind in ("lower_field_name", "upper_field_name", "field_name"):
            name = getattr(attr, kind, None)
            if isinstance(name, str):
                fields.add(name)
    config: Json = json.loads(json.dumps({f: getattr(made, f) for f in sorted(fields)}))
    return config


def sub_configs(spec: ProceduralSpec) -> dict[str, Json]:
    """Each generator's full config as the dataset that makes its rows gets it: one generator gets
    the spec's size and seed; in a mixture, reasoning-gym's composite gives generator i the size
    and `seed + i + 1` unless its config sets them. A generator's curriculum level is resolved."""
    if len(spec.generators) == 1:
        g = spec.generators[0]
        return {g.name: {**level_config(g), "size": spec.size, "seed": spec.seed}}
    return {
        g.name: {"size": spec.size, "seed": spec.seed + i + 1, **level_config(g)}
        for i, g in enumerate(spec.generators)
    }


def open_dataset(spec: ProceduralSpec) -> ProceduralDataset:
    """The reasoning-gym dataset a spec names (its composite for several generators)."""
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec

    check_names(spec.names)
    try:
        if len(spec.generators) == 1:  # the dataset rebuild_entry finds again in this process
            g = spec.generators[0]
            return _dataset(g.name, json.dumps(sub_configs(spec)[g.name], sort_keys=True))
        configs = {g.name: level_config(g) for g in spec.generators}
        specs = [DatasetSpec(name=g.name, weight=g.weight, config=configs[g.name]) for g in spec.generators]
        return reasoning_gym.create_dataset("composite", size=spec.size, seed=spec.seed, datasets=specs)
    except (TypeError, ValueError, AssertionError, KeyError) as exc:
        raise InvalidGeneratorSpec(f"reasoning-gym refused the spec: {type(exc).__name__}: {exc}") from None


def system_text(prompt: str) -> str:
    """reasoning-gym's system prompt of that name, or `prompt` itself."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return str(SYSTEM_PROMPTS.get(prompt, prompt))


def to_row(entry: Mapping[str, Any], source: Json, system: str = "") -> Json:
    """One entry as a NeMo Gym row (see the module docstring), after a system message if given."""
    question = str(entry["question"])
    metadata = entry.get("metadata", {})
    messages = [{"role": "system", "content": system}] if system else []
    return {
        "responses_create_params": {"input": [*messages, {"role": "user", "content": question}]},
        "question": question,
        "answer": entry.get("answer"),
        "metadata": json.loads(json.dumps(metadata, default=repr)),
        "agent_ref": dict(AGENT_REF),
        "task_id": f"{source['generator']}/{source['index']}",
        SOURCE_FIELD: source,
    }


def generate_rows(spec: ProceduralSpec) -> Iterator[Json]:
    """The spec's rows, in index order; the same spec always gives the same rows."""
    dataset = open_dataset(spec)
    configs = sub_configs(spec)
    system = system_text(spec.system_prompt) if spec.system_prompt else ""
    for index in range(spec.size):
        entry = dataset[index]
        name = str(entry.get("metadata", {}).get("source_dataset", spec.names[0]))
        source: Json = {"generator": name, "config": configs[name], "index": index}
        if name in NOT_JSON_SAFE:
            source["rebuild"] = True
        yield to_row(entry, source, system)


@functools.lru_cache(maxsize=32)
def _dataset(name: str, config_json: str) -> ProceduralDataset:
    import reasoning_gym

    return reasoning_gym.create_dataset(name, **json.loads(config_json))


def rebuild_entry(source: Mapping[str, Any]) -> Json:
    """The entry `source` ({generator, config, index}) names, made again (datasets are cached)."""
    name, config, index = source.get("generator"), source.get("config"), source.get("index")
    if not isinstance(name, str) or not isinstance(config, Mapping) or not isinstance(index, int):
        raise EntryMismatch(
            f"{SOURCE_FIELD} must hold generator, config and index, not {dict(source)!r:.200}"
        )
    check_names((name,))
    try:
        dataset = _dataset(name, json.dumps(config, sort_keys=True))
        entry: Json = dataset[index]
    except (TypeError, ValueError, AssertionError, KeyError, IndexError) as exc:
        raise EntryMismatch(f"{name} cannot make entry {index} of config {config!r:.200}: {exc}") from None
    return entry
