"""mesh/config.read_fields: a config dataclass filled from its registered ROLLMESH_* variables."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from rollmesh.mesh.config import ENV_VARS
from rollmesh.mesh.config import read_fields
from rollmesh.mesh.config import setting
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.server import build_server
from rollmesh.verifier.config import SandboxLimits
from rollmesh.verifier.config import VerifierConfig


@dataclass(frozen=True)
class _Knobs:
    wall_s: float = setting("ROLLMESH_VERIFIER_SANDBOX_WALL_S")
    cpu_s: int = setting("ROLLMESH_VERIFIER_SANDBOX_CPU_S")
    output_kb: int = 7  # a field named like a registered variable's end, but not a setting
    not_a_variable: str = "kept"


def test_setting_fields_are_filled_from_their_variables_parsed_to_their_types() -> None:
    got = read_fields(_Knobs, {"ROLLMESH_VERIFIER_SANDBOX_WALL_S": "3"})
    assert got == _Knobs(wall_s=3.0, cpu_s=SandboxLimits().cpu_s, output_kb=7, not_a_variable="kept")
    assert isinstance(got.wall_s, float) and isinstance(got.cpu_s, int)


def test_only_setting_fields_are_read_from_the_environment() -> None:
    env = {"ROLLMESH_VERIFIER_SANDBOX_OUTPUT_KB": "9", "ROLLMESH_VERIFIER_SANDBOX_CPU_S": "9"}
    assert read_fields(_Knobs, env) == _Knobs(cpu_s=9)


def test_a_setting_fields_default_is_its_registered_default() -> None:
    assert _Knobs().wall_s == ENV_VARS["ROLLMESH_VERIFIER_SANDBOX_WALL_S"].default == 10.0


def test_given_values_win_over_the_environment() -> None:
    env = {"ROLLMESH_VERIFIER_SANDBOX_CPU_S": "9"}
    assert read_fields(_Knobs, env, cpu_s=2).cpu_s == 2


def test_a_none_given_is_a_flag_left_out_the_variable_then_the_default_apply() -> None:
    env = {"ROLLMESH_VERIFIER_SANDBOX_CPU_S": "9"}
    got = read_fields(_Knobs, env, cpu_s=None, wall_s=None, not_a_variable=None)
    # cpu_s from the environment, wall_s from its variable's registered default, the other its own
    assert got == _Knobs(wall_s=SandboxLimits().wall_s, cpu_s=9, not_a_variable="kept")


def test_verifier_config_reads_every_sandbox_limit() -> None:
    env = {"ROLLMESH_VERIFIER_SANDBOX_MEMORY_MB": "128", "ROLLMESH_VERIFIER_SANDBOX_ISOLATION": " Process "}
    cfg = VerifierConfig.from_env(environ=env)
    assert cfg.sandbox.limits.memory_mb == 128 and cfg.sandbox.isolation == "process"


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("ROLLMESH_VERIFIER_SANDBOX_WALL_S", "nan"),  # a wall limit that never ran out
        ("ROLLMESH_GRACE_SECONDS", "1e400"),
        ("ROLLMESH_GATEWAY_SESSION_TTL_S", "-5"),
        ("ROLLMESH_VERIFIER_MAX_SESSIONS", "-1"),
        ("ROLLMESH_OPENAI_HTTP_PORT", "70000"),
    ],
)
def test_a_number_variable_that_is_negative_nan_or_infinite_is_a_config_error(name: str, raw: str) -> None:
    var = ENV_VARS[name]
    with pytest.raises(ConfigError, match=name):
        var.parse(name, raw)


def test_the_message_limit_is_a_config_error_at_server_start_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ROLLMESH_MAX_MESSAGE_MB=nan was 'cannot convert float NaN to integer' out of `rollmesh serve`."""
    assert ENV_VARS["ROLLMESH_OPENAI_HTTP_PORT"].parse("p", "-1") == -1  # off
    for raw in ("nan", "inf", "4096", "0"):
        monkeypatch.setenv("ROLLMESH_MAX_MESSAGE_MB", raw)
        with pytest.raises(ConfigError, match="ROLLMESH_MAX_MESSAGE_MB"):
            asyncio.run(build_server([]))
