"""Every ROLLMESH_* default is written once, in mesh/config.py's ENV_VARS: a config dataclass field
read from a variable is declared `setting("ROLLMESH_...")` and takes the registry's default, of the
field's own type."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from pathlib import Path
from typing import Any

import pytest

import rollmesh
from rollmesh.mesh.config import ENV_VARS
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
