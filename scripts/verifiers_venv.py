"""A virtualenv with PrimeIntellect's verifiers, for running verifiers environments behind rollmesh's
bridge (verifier/bridges/verifiers_env.py) and for the tests that compare rollmesh's rewards with verifiers'.

    python scripts/verifiers_venv.py [--version 0.3.1] [--package PKG ...]   # prints its interpreter
    python scripts/verifiers_venv.py --version 0.4.0                        # verifiers.v1 tasksets

verifiers needs Python >= 3.11 and brings its own openai, datasets, mcp, ... pins: it never shares
rollmesh's virtualenv. The venv is `$ROLLMESH_CACHE_DIR/verifiers/<version>/venv/` (default cache
~/.cache/rollmesh), one per version, made with Python 3.11 (`python3.11` on PATH or pyenv's) by
scripts/venv_build.py, as scripts/nemo_gym.py's venv is. A stamp lists what is installed: a named
package that is missing is added, an interrupted build (no stamp) is made again, and a file lock
makes concurrent callers wait for one build. Exit status: 0 ready (the interpreter's path on
stdout), 1 a step failed, 3 no Python 3.11 on this machine (one line on stderr says which).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from venv_build import AssetError  # type: ignore[import-not-found]
from venv_build import NoInterpreter  # type: ignore[import-not-found]
from venv_build import build_venv  # type: ignore[import-not-found]
from venv_build import cache_root  # type: ignore[import-not-found]
from venv_build import find_interpreter  # type: ignore[import-not-found]
from venv_build import print_venv  # type: ignore[import-not-found]

__all__ = ["AssetError", "NoInterpreter", "venv"]

DEFAULT_VERSION = "0.3.1"
PYTHON = "3.11.0"


def venv(version: str = DEFAULT_VERSION, packages: tuple[str, ...] = ()) -> Path:
    """The interpreter of a virtualenv with verifiers `version` and `packages` (made, or completed,
    once; see the module docstring)."""
    return Path(
        build_venv(
            cache_root("verifiers") / version / "venv",
            base=lambda: find_interpreter(PYTHON, f"verifiers=={version}"),
            library=lambda: [f"verifiers=={version}"],
            what=f"verifiers=={version}",
            key="packages",
            items=packages,
            stamp_fields={"verifiers": version},
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--package", action="append", help="an environment package to install (repeatable)")
    args = parser.parse_args(argv)
    return int(print_venv("verifiers_venv", lambda: venv(args.version, tuple(args.package or ()))))


if __name__ == "__main__":
    sys.exit(main())
