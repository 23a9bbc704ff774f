"""A virtualenv with PrimeIntellect's verifiers, for running verifiers environments behind rollmesh's
bridge (verifier/verifiers_env.py) and for the tests that compare rollmesh's rewards with verifiers'.

    python scripts/verifiers_venv.py [--version 0.3.1] [--package PKG ...]   # prints its interpreter

verifiers needs Python >= 3.11 and brings its own openai, datasets, mcp, ... pins: it never shares
rollmesh's virtualenv. The venv is `$ROLLMESH_CACHE_DIR/verifiers/<version>/venv/` (default cache
~/.cache/rollmesh), made with Python 3.11 (`python3.11` on PATH or pyenv's; scripts/nemo_gym.py's
find_interpreter). A stamp lists what is installed: a named package that is missing is added, an
interrupted build (no stamp) is made again, and a file lock makes concurrent callers wait for one
build. Exit status: 0 ready (the interpreter's path on stdout), 1 a step failed, 3 no Python 3.11
on this machine (one line on stderr says which).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nemo_gym import NemoGymAssetError, NoInterpreter, find_interpreter, locked  # type: ignore[import-not-found]

DEFAULT_VERSION = "0.3.1"
PYTHON = "3.11.0"
_PIP_TIMEOUT_S = 1800


def cache_root() -> Path:
    base = os.environ.get("ROLLMESH_CACHE_DIR") or str(Path.home() / ".cache" / "rollmesh")
    return Path(base) / "verifiers"


def _pip(python: Path, args: list[str], what: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=_PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NemoGymAssetError(f"pip install of {what} took over {_PIP_TIMEOUT_S}s") from None
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        raise NemoGymAssetError(f"pip could not install {what}: {(errors or ['no output'])[-1]}")


def venv(version: str = DEFAULT_VERSION, packages: tuple[str, ...] = ()) -> Path:
    """The interpreter of a virtualenv with verifiers `version` and `packages` (made, or completed,
    once; see the module docstring)."""
    root = cache_root() / version
    folder = root / "venv"
    python = folder / "bin" / "python"
    stamp = folder / ".rollmesh-installed.json"

    def installed() -> set[str]:
        try:
            return set(json.loads(stamp.read_text())["packages"])
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    if stamp.exists() and set(packages) <= installed():
        return python
    base = find_interpreter(PYTHON, f"verifiers=={version}")
    with locked(root / ".venv.lock"):
        have = installed()
        if stamp.exists() and set(packages) <= have:
            return python
        if not stamp.exists():
            shutil.rmtree(folder, ignore_errors=True)
            done = subprocess.run(
                [str(base), "-m", "venv", str(folder)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise NemoGymAssetError(f"{base} -m venv {folder} failed: {done.stderr.strip()[-300:]}")
            _pip(python, [f"verifiers=={version}"], f"verifiers=={version}")
        missing = sorted(set(packages) - have)
        if missing:
            _pip(python, missing, ", ".join(missing))
        tmp = stamp.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"verifiers": version, "python": str(base), "packages": sorted(have | set(packages))})
        )
        tmp.rename(stamp)
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--package", action="append", help="an environment package to install (repeatable)")
    args = parser.parse_args(argv)
    try:
        print(venv(args.version, tuple(args.package or ())))
    except NoInterpreter as exc:
        print(f"verifiers_venv: {exc}", file=sys.stderr)
        return 3
    except NemoGymAssetError as exc:
        print(f"verifiers_venv: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
