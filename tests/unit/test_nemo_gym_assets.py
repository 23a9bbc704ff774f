"""scripts/nemo_gym.py data: NeMo Gym's own example rows and recorded rollouts, fetched from PyPI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import nemo_gym_assets


def test_servers_carry_their_rows_and_recorded_rewards(nemo_gym_servers: Path) -> None:
    rollouts = nemo_gym_servers / "example_single_tool_call" / "data" / "example_rollouts.jsonl"
    rows = [json.loads(line) for line in rollouts.read_text().splitlines() if line.strip()]
    assert len(rows) == 5
    assert all(isinstance(r["reward"], (int, float)) and "response" in r for r in rows)
    assert (nemo_gym_servers / "example_single_tool_call" / "app.py").is_file()
    assert len(list(nemo_gym_servers.glob("*/data/example_rollouts.jsonl"))) >= 90


def test_a_second_call_uses_the_cache(nemo_gym_servers: Path) -> None:
    stamp = nemo_gym_servers.parent / ".unpacked"
    before = stamp.stat().st_mtime_ns
    assert Path(nemo_gym_assets.data("0.4.0")) == nemo_gym_servers.parent
    assert stamp.stat().st_mtime_ns == before


def test_a_version_pip_cannot_find_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLMESH_CACHE_DIR", str(tmp_path))
    with pytest.raises(nemo_gym_assets.NemoGymAssetError, match=r"nemo-gym==0\.0\.0"):
        nemo_gym_assets.data("0.0.0")


def test_no_interpreter_for_nemo_gym_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(nemo_gym_assets.NoInterpreter, match=r"nemo-gym==0\.4\.0 needs Python >= 3\.12"):
        nemo_gym_assets.find_python("0.4.0")


def test_a_built_venv_is_reused_and_runs_nemo_gym(nemo_gym_python: Path) -> None:
    import subprocess
    import time

    t0 = time.monotonic()
    assert Path(nemo_gym_assets.venv("0.4.0")) == nemo_gym_python
    assert time.monotonic() - t0 < 5  # warm: the stamp says everything is there
    done = subprocess.run(
        [str(nemo_gym_python), "-c", "import nemo_gym, xmltodict, math_verify; print(nemo_gym.__file__)"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0 and "site-packages/nemo_gym" in done.stdout, done.stderr


def test_a_cpython_build_python_made_is_found_and_an_older_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nemo-gym 0.5-0.7 needs >= 3.13.14: pyenv's 3.13.0 is passed over, and the CPython
    `scripts/nemo_gym.py python` installs (stamped) under the cache is taken; an unstamped one (a build
    cut short) is not."""
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("ROLLMESH_CACHE_DIR", str(tmp_path / "cache"))

    def interpreter(folder: Path, version: str, stamp: bool) -> Path:
        python = folder / version / "bin" / "python3"
        python.parent.mkdir(parents=True)
        python.write_text(f"#!/bin/sh\necho '{version.replace('.', ' ')}'\n")
        python.chmod(0o755)
        if stamp:
            (folder / version / ".rollmesh-built").write_text("python3.13 (Debian source package)\n")
        return python

    interpreter(tmp_path / "pyenv" / "versions", "3.13.0", stamp=False)
    with pytest.raises(nemo_gym_assets.NoInterpreter, match=r"nemo-gym==0\.7\.0 needs Python >= 3\.13\.14"):
        nemo_gym_assets.find_python("0.7.0")
    interpreter(tmp_path / "cache" / "python", "3.13.18", stamp=False)
    with pytest.raises(nemo_gym_assets.NoInterpreter, match=r"scripts/nemo_gym\.py python"):
        nemo_gym_assets.find_python("0.7.0")
    built = interpreter(tmp_path / "cache" / "python", "3.13.15", stamp=True)
    assert nemo_gym_assets.find_python("0.7.0") == built
    assert nemo_gym_assets.build_python("3.13.14") == built  # found: nothing is fetched or built


def test_a_debian_roots_interpreter_is_found_by_its_real_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Debian root's usr/ linked as `<cache>/python/3.13.15` (scripts/debian_root.py) is found,
    by its real path: a venv made with it then names the folder a confined sidecar may read."""
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("ROLLMESH_CACHE_DIR", str(tmp_path / "cache"))
    usr = tmp_path / "cache" / "python" / "forky" / "usr"
    (usr / "bin").mkdir(parents=True)
    (usr / "bin" / "python3").write_text("#!/bin/sh\necho '3 13 15'\n")
    (usr / "bin" / "python3").chmod(0o755)
    (usr / ".rollmesh-built").write_text("python3.13 3.13.15-1 (Debian forky root)\n")
    (tmp_path / "cache" / "python" / "3.13.15").symlink_to(Path("forky") / "usr")
    assert nemo_gym_assets.python_for("0.7.0") == usr / "bin" / "python3"


def test_no_root_no_debian_root_and_the_reason_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("ROLLMESH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys.modules["debian_root"].os, "geteuid", lambda: 1000)
    with pytest.raises(
        nemo_gym_assets.NoInterpreter, match=r"Debian forky root .* cannot be made \(not root\)"
    ):
        nemo_gym_assets.python_for("0.7.0")
