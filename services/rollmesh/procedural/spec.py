"""A generator spec: which reasoning-gym generators, with what weights and configs, how many rows
from which seed. Plain data, no reasoning-gym import; `rows.py` checks the names and configs.

As JSON (a dataset file a job names instead of a JSONL, or `rollmesh datasets generate --spec`)::

    {"reasoning_gym": {"size": 200, "seed": 1, "system_prompt": "default",
                       "generators": [{"name": "basic_arithmetic", "weight": 2, "config": {"max_terms": 2}},
                                      {"name": "chain_sum", "level": 2}, "leg_counting"]}}

A generator given as a bare string has weight 1 and its default config. `level` puts a generator
at that level of reasoning-gym's curriculum for it (rows.py resolves it into a config). One generator gives
reasoning-gym's own dataset (`create_dataset(name, size=, seed=, **config)`); several give its
composite dataset (weighted sampling per index, sub-dataset i seeded `seed + i + 1` unless its
config sets a seed), so the rows are the ones reasoning-gym and NeMo Gym's create_dataset.py make.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import Any

from rollmesh.procedural.errors import InvalidGeneratorSpec

#: The top-level key of a spec file.
SPEC_KEY = "reasoning_gym"
MAX_SIZE = 10_000_000
_SPEC_KEYS = frozenset({"generators", "size", "seed", "system_prompt"})
_GENERATOR_KEYS = frozenset({"name", "weight", "config", "level"})


@dataclass(frozen=True)
class GeneratorSpec:
    name: str
    weight: float = 1.0
    config: Mapping[str, Any] = field(default_factory=dict)
    #: reasoning-gym's curriculum level (0 the easiest) for every attribute its curriculum defines
    #: (an attribute with fewer levels takes its hardest); its values win over `config`'s. None: no
    #: curriculum, the generator's defaults and `config`.
    level: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "weight": self.weight, "config": dict(self.config)}
        if self.level is not None:
            out["level"] = self.level
        return out


@dataclass(frozen=True)
class ProceduralSpec:
    generators: tuple[GeneratorSpec, ...]
    size: int
    seed: int = 0
    #: A system message before each question: one of reasoning-gym's SYSTEM_PROMPTS by name
    #: ("default", "simple", "direct", ...) or the text itself; "" for none (NeMo Gym's rows).
    system_prompt: str = ""

    def __post_init__(self) -> None:
        if not self.generators:
            raise InvalidGeneratorSpec("a generator spec names no generator")
        names = [g.name for g in self.generators]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidGeneratorSpec(f"generator {dupes[0]!r} is named twice; give it one weight")
        if not 0 < self.size <= MAX_SIZE:
            raise InvalidGeneratorSpec(f"size must be 1..{MAX_SIZE:,}, not {self.size}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.generators)

    def at_level(self, level: int) -> ProceduralSpec:
        """The same spec with every generator at curriculum `level` (a trainer raising difficulty
        as its reward rises submits the next level's spec)."""
        return replace(self, generators=tuple(replace(g, level=level) for g in self.generators))

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "generators": [g.to_json() for g in self.generators],
            "size": self.size,
            "seed": self.seed,
        }
        if self.system_prompt:
            body["system_prompt"] = self.system_prompt
        return {SPEC_KEY: body}

    @classmethod
    def from_json(cls, data: Any, *, where: str = "the spec") -> ProceduralSpec:
        """Read `{"reasoning_gym": {...}}` (or the inner object); every problem is one
        InvalidGeneratorSpec naming `where`."""
        if isinstance(data, Mapping) and SPEC_KEY in data:
            data = data[SPEC_KEY]
        if not isinstance(data, Mapping):
            raise InvalidGeneratorSpec(f"{where}: must be a JSON object with {SPEC_KEY!r}")
        _known_keys_only(data, _SPEC_KEYS, where)
        raw = data.get("generators")
        if not isinstance(raw, list) or not raw:
            raise InvalidGeneratorSpec(f"{where}: `generators` must be a non-empty list")
        size = _integer(data.get("size"), f"{where}: `size`")
        seed = _integer(data.get("seed", 0), f"{where}: `seed`")
        system = data.get("system_prompt", "")
        if not isinstance(system, str):
            raise InvalidGeneratorSpec(f"{where}: `system_prompt` must be a string")
        gens = tuple(_generator(g, f"{where}: generators[{i}]") for i, g in enumerate(raw))
        return cls(gens, size, seed, system)


def _known_keys_only(data: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidGeneratorSpec(f"{where}: unknown key {unknown[0]!r} (known: {sorted(known)})")


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidGeneratorSpec(f"{what} must be an integer, not {value!r}")
    return value


def _generator(raw: Any, where: str) -> GeneratorSpec:
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, Mapping):
        raise InvalidGeneratorSpec(f"{where}: a generator is a name or an object with `name`")
    _known_keys_only(raw, _GENERATOR_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidGeneratorSpec(f"{where}: `name` must be a generator name")
    weight = raw.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or weight <= 0
    ):
        raise InvalidGeneratorSpec(f"{where}: `weight` must be a positive number, not {weight!r}")
    config = raw.get("config", {})
    if not isinstance(config, Mapping):
        raise InvalidGeneratorSpec(f"{where}: `config` must be an object")
    level = raw.get("level")
    if level is not None and (isinstance(level, bool) or not isinstance(level, int) or level < 0):
        raise InvalidGeneratorSpec(f"{where}: `level` must be an integer >= 0, not {level!r}")
    return GeneratorSpec(name.strip(), float(weight), dict(config), level)


def parse_generator_arg(arg: str) -> GeneratorSpec:
    """`name` or `name:weight` (the CLI's --generator)."""
    name, _, weight = arg.partition(":")
    if not weight:
        return _generator({"name": name}, f"--generator {arg!r}")
    try:
        value = float(weight)
    except ValueError:
        raise InvalidGeneratorSpec(f"--generator {arg!r}: the weight after ':' must be a number") from None
    return _generator({"name": name, "weight": value}, f"--generator {arg!r}")
