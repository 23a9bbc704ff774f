"""mesh/config.read_fields: a config dataclass filled from its registered ROLLMESH_* variables."""

from __future__ import annotations

from dataclasses import dataclass

from rollmesh.mesh.config import read_fields
from rollmesh.verifier.config import SandboxLimits, VerifierConfig


@dataclass(frozen=True)
class _Knobs:
    wall_s: float = 1.5  # ROLLMESH_VERIFIER_SANDBOX_WALL_S is registered
    cpu_s: int = 1  # so is ..._CPU_S
    not_a_variable: str = "kept"


def test_prefixed_variables_fill_fields_with_their_declared_types() -> None:
    got = read_fields(_Knobs, "ROLLMESH_VERIFIER_SANDBOX_", {"ROLLMESH_VERIFIER_SANDBOX_WALL_S": "3"})
    assert got == _Knobs(wall_s=3.0, cpu_s=SandboxLimits().cpu_s, not_a_variable="kept")
    assert isinstance(got.wall_s, float) and isinstance(got.cpu_s, int)


def test_given_values_win_over_the_environment() -> None:
    env = {"ROLLMESH_VERIFIER_SANDBOX_CPU_S": "9"}
    assert read_fields(_Knobs, "ROLLMESH_VERIFIER_SANDBOX_", env, cpu_s=2).cpu_s == 2


def test_a_none_given_is_a_flag_left_out_the_variable_then_the_default_apply() -> None:
    env = {"ROLLMESH_VERIFIER_SANDBOX_CPU_S": "9"}
    got = read_fields(_Knobs, "ROLLMESH_VERIFIER_SANDBOX_", env, cpu_s=None, wall_s=None, not_a_variable=None)
    # cpu_s from the environment, wall_s from its variable's registered default, the other its own
    assert got == _Knobs(wall_s=SandboxLimits().wall_s, cpu_s=9, not_a_variable="kept")


def test_verifier_config_reads_every_sandbox_limit() -> None:
    env = {"ROLLMESH_VERIFIER_SANDBOX_MEMORY_MB": "128", "ROLLMESH_VERIFIER_SANDBOX_ISOLATION": " Process "}
    cfg = VerifierConfig.from_env(environ=env)
    assert cfg.sandbox.limits.memory_mb == 128 and cfg.sandbox.isolation == "process"
