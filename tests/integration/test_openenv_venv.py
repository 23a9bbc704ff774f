"""scripts/openenv_venv.py: each OpenEnv distribution's venv holds the version asked for, with the
client and server modules rollmesh's OpenEnv tests drive (built once, cached: the fixtures)."""

from __future__ import annotations

import subprocess
from pathlib import Path

PROBE = (
    "import importlib.metadata as m, sys\n"
    "import openenv.core.env_client, openenv.core.env_server.http_server\n"
    "print(m.version(sys.argv[1]))"
)


def _check(python: Path, dist: str, version: str) -> None:
    done = subprocess.run(
        [str(python), "-c", PROBE, dist], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == version
    assert python.parent.parent.parent.name == f"{dist}-{version}"


def test_openenv_core_venv(openenv_python: Path) -> None:
    _check(openenv_python, "openenv-core", "0.3.0")


def test_openenv_venv(openenv_010_python: Path) -> None:
    _check(openenv_010_python, "openenv", "0.10.0")
