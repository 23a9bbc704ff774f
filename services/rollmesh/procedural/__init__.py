"""Procedural datasets: reasoning-gym's task generators as rows, and their scoring.

`spec.py` reads a generator spec (one or several generators with weights and configs, a size and a
seed); `rows.py` turns it into NeMo Gym-format rows (the shape NeMo Gym's reasoning_gym resources
server reads and its create_dataset.py writes); `scoring.py` scores an answer with the generator's
own scorer, in a verifier worker process. reasoning-gym itself is imported lazily, inside the
functions that need it (its import takes a second or two).
"""

from __future__ import annotations

from rollmesh.procedural.errors import EntryMismatch
from rollmesh.procedural.errors import InvalidGeneratorSpec
from rollmesh.procedural.errors import UnknownGenerator
from rollmesh.procedural.spec import SPEC_KEY
from rollmesh.procedural.spec import GeneratorSpec
from rollmesh.procedural.spec import ProceduralSpec

__all__ = [
    "SPEC_KEY",
    "EntryMismatch",
    "GeneratorSpec",
    "InvalidGeneratorSpec",
    "ProceduralSpec",
    "UnknownGenerator",
]
