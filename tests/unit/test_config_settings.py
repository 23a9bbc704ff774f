"""Every ROLLMESH_* default is written once, in mesh/config.py's ENV_VARS: a config dataclass field
read from a variable is declared `setting("ROLLMESH_...")` and takes the registry's default, of the
field's own type. The CLI does not import the registry (it costs `--help` a tenth of a second), so
what its flags say of a variable's default is checked against it here."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import typer

import rollmesh
from rollmesh.cli import build_app
from rollmesh.mesh.config import ENV_VARS
from rollmesh.mesh.config import parse_http_port
from rollmesh.mesh.config import read_fields
from rollmesh.mesh.config import variable_of

SERVICES = Path(rollmesh.__file__).parent


def _declares_settings(node: ast.ClassDef) -> bool:
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name == "setting":
                return True
    return False


def _setting_classes() -> list[type[Any]]:
    """Every class in services/rollmesh with a `setting(...)` field (found in the source, so a new
    config is checked without being listed here)."""
    found = []
    for path in sorted(SERVICES.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _declares_settings(node):
                module = ".".join(("rollmesh", *path.relative_to(SERVICES).with_suffix("").parts))
                found.append(getattr(importlib.import_module(module), node.name))
    return found


CLASSES = _setting_classes()


def test_the_configs_that_read_variables_are_found() -> None:
    names = {cls.__name__ for cls in CLASSES}
    expected = {"ServerConfig", "GatewayConfig", "ServingConfig", "VerifierConfig", "SandboxConfig"}
    assert expected | {"SandboxLimits", "RestartPolicy"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_each_setting_fields_default_is_the_registrys_and_of_the_fields_type(cls: type[Any]) -> None:
    hints = typing.get_type_hints(cls)
    settings = [(f, variable_of(f)) for f in dataclasses.fields(cls)]
    assert any(var for _, var in settings)
    for f, var in settings:
        if var is None:
            continue
        registered = ENV_VARS[var].default
        assert f.default is registered, (cls.__name__, f.name, var)
        assert type(registered) is hints[f.name], (cls.__name__, f.name, var, registered)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_each_setting_field_is_read_from_its_own_variable(cls: type[Any]) -> None:
    """A variable set in the environment reaches its field, and its field only."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        var = variable_of(f)
        if var is None or hints[f.name] not in (int, float):
            continue
        value = ENV_VARS[var].default + 1  # still a valid count, size, port or seconds
        got = read_fields(cls, {var: str(value)}, **_required(cls))
        assert getattr(got, f.name) == value, (cls.__name__, f.name, var)


def _required(cls: type[Any]) -> dict[str, Any]:
    """What `cls` cannot be built without (ServingConfig's model path)."""
    missing = dataclasses.MISSING
    return {
        f.name: "m" for f in dataclasses.fields(cls) if f.default is missing and f.default_factory is missing
    }


def _options() -> list[tuple[str, Any]]:
    """Every parameter of every `rollmesh` command (typer's own click's), with the command's name."""
    found: list[tuple[str, Any]] = []

    def walk(command: Any, name: str) -> None:
        for sub, child in getattr(command, "commands", {}).items():
            walk(child, f"{name} {sub}")
        found.extend((name, p) for p in command.params)

    walk(typer.main.get_command(build_app()), "rollmesh")
    return found


def test_a_flag_read_from_a_variable_defaults_to_nothing_given_or_to_the_registrys_default() -> None:
    """`up --host` (ROLLMESH_BIND_HOST), `--replicas`, `--http-port`: typer reads the variable, so the
    flag's own default stands where the registry's would."""
    checked = 0
    for command, p in _options():
        var = getattr(p, "envvar", None)
        if isinstance(var, str) and var.startswith("ROLLMESH_"):
            assert p.default in ("", None) or p.default == ENV_VARS[var].default, (command, p.name, var)
            checked += p.default not in ("", None)
    assert checked >= 3


# "(default: ROLLMESH_RESTART_MAX or 5)", "(embedded; default ROLLMESH_REPLICAS, else 1)"
_SAID_DEFAULT = re.compile(r"(ROLLMESH_[A-Z0-9_]*[A-Z0-9]),? (?:or|else) ([^ ),;]+)")


def test_what_a_flags_help_says_a_variable_defaults_to_is_the_registrys_default() -> None:
    said = [(c, m) for c, p in _options() for m in _SAID_DEFAULT.finditer(getattr(p, "help", None) or "")]
    assert len(said) >= 6
    for command, match in said:
        var, text = match.groups()
        registered = ENV_VARS[var]
        if registered.parser is parse_http_port and text == "off":
            text = "-1"
        assert registered.parse(var, text) == registered.default, (command, match.group(0))
