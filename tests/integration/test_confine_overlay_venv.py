"""A confined child whose interpreter is an overlay virtualenv (a `.pth` file in its site-packages
reaching another folder of packages: the obvious way to add one managed server's missing
requirement) imports what that file reaches (#43: the confinement showed only the venv and the
interpreter's prefix, so the import failed)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from rollmesh.mesh.confine import Confinement
from rollmesh.mesh.confine import UidLeases
from rollmesh.mesh.confine import command
from rollmesh.mesh.confine import program_paths
from rollmesh.mesh.confine import pth_paths
from rollmesh.mesh.confine import read_mode


def overlay(tmp_path: Path) -> tuple[Path, Path]:
    """A virtualenv (no pip) whose site-packages holds `extra.pth` naming a folder with `overlaid.py`."""
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "overlaid.py").write_text("WHERE = 'the overlay'\n")
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    (site,) = env.glob("lib/python3*/site-packages")
    (site / "extra.pth").write_text(f"# reaches the extra folder\nimport os\n{extra}\n../../../../nowhere\n")
    return env, extra


def test_the_pth_folders_are_readable(tmp_path: Path) -> None:
    env, extra = overlay(tmp_path)
    assert pth_paths(env) == [os.path.realpath(extra)]
    assert os.path.realpath(extra) in program_paths([str(env / "bin" / "python"), "-c", "pass"])


@pytest.mark.skipif(os.geteuid() != 0, reason="uid and mount confinement needs root")
async def test_a_confined_overlay_venv_imports_what_its_pth_reaches(tmp_path: Path) -> None:
    env, _ = overlay(tmp_path)
    argv = [str(env / "bin" / "python"), "-c", "import overlaid; print(overlaid.WHERE)"]
    leases = UidLeases()
    uid = await leases.lease()
    try:
        confinement = Confinement(uid=uid, readable=program_paths(argv))
        mode_file = tmp_path / "mode"
        done = await asyncio.to_thread(
            subprocess.run,
            command(argv, confinement, mode_file),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        leases.release(uid)
    assert "mount" in read_mode(mode_file), read_mode(mode_file)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "the overlay"
    assert sys.prefix != str(env)
