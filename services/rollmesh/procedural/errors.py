"""Errors of procedural datasets (reasoning-gym generator specs), each with its status code and reason."""

from __future__ import annotations

from rollmesh.mesh import errors as mesh


class InvalidGeneratorSpec(mesh.InvalidArgument):
    """A generator spec that cannot be read: not an object, an unknown key, a bad size, seed or
    weight, a config a generator refuses."""

    reason = "INVALID_GENERATOR_SPEC"


class UnknownGenerator(mesh.InvalidArgument):
    """A generator name reasoning-gym does not register."""

    reason = "UNKNOWN_GENERATOR"


class EntryMismatch(mesh.InvalidArgument):
    """A row's stored entry is not what its (generator, config, index) gives today (another
    reasoning-gym version wrote it, or it was edited): its scorer's inputs cannot be trusted."""

    reason = "REASONING_GYM_ENTRY_MISMATCH"
