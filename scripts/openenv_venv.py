"""A virtualenv with OpenEnv (`openenv-core` or `openenv` from PyPI), for running OpenEnv environment
servers behind rollmesh's OpenEnv kind and for the tests that drive `rollmesh serve openenv` with
OpenEnv's own client.

    python scripts/openenv_venv.py [--version 0.3.0] [--package PKG ...]   # openenv-core: its interpreter
    python scripts/openenv_venv.py --dist openenv --version 0.10.0         # the `openenv` one
    python scripts/openenv_venv.py --dist openenv --trl                    # + TRL (rollmesh's pins)

OpenEnv brings gradio, fastmcp, huggingface_hub and openai pins of its own: it never shares rollmesh's
virtualenv. Both distributions install the same `openenv` package, so each has a venv of its own:
`$ROLLMESH_CACHE_DIR/openenv/<dist>-<version>/venv/` (default cache ~/.cache/rollmesh), made with
Python 3.11 (`python3.11` on PATH or pyenv's) by scripts/venv_build.py, as scripts/verifiers_venv.py's
is. `--trl` adds TRL and what its GRPOTrainer needs (torch, transformers, accelerate, datasets) at
the versions requirements.lock pins for rollmesh's own venv (`trl_packages`), for the test that runs
TRL's trainer on a served environment through OpenEnv's client. A stamp lists what is installed: a
named package that is missing is added, an interrupted build (no stamp) is made again, and a file
lock makes concurrent callers wait for one build. Exit status:
0 ready (the interpreter's path on stdout), 1 a step failed, 3 no Python 3.11 on this machine (one
line on stderr says which).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import venv_build  # type: ignore[import-not-found]

__all__ = ["AssetError", "NoInterpreter", "venv"]

AssetError = venv_build.AssetError
NoInterpreter = venv_build.NoInterpreter

DEFAULT_DIST = "openenv-core"
#: The version of each distribution used when none is named.
DEFAULT_VERSIONS = {"openenv-core": "0.3.0", "openenv": "0.10.0"}
PYTHON = "3.11.0"


#: What TRL's GRPOTrainer needs besides OpenEnv, pinned as rollmesh's venv pins them.
TRL = ("torch", "transformers", "trl", "accelerate", "datasets")


def trl_packages() -> tuple[str, ...]:
    """`TRL` at requirements.lock's pins (`name==version` lines)."""
    lock = Path(__file__).resolve().parent.parent / "requirements.lock"
    pins = dict(ln.strip().split("==", 1) for ln in lock.read_text().splitlines() if "==" in ln)
    missing = [name for name in TRL if name not in pins]
    if missing:
        raise AssetError(f"{lock} pins no {', '.join(missing)}")
    return tuple(f"{name}=={pins[name]}" for name in TRL)


def venv(version: str | None = None, packages: tuple[str, ...] = (), dist: str = DEFAULT_DIST) -> Path:
    """The interpreter of a virtualenv with OpenEnv's `dist` at `version` (its default when None) and
    `packages` (made, or completed, once; see the module docstring)."""
    if dist not in DEFAULT_VERSIONS:
        raise AssetError(f"unknown OpenEnv distribution {dist!r}; one of {', '.join(DEFAULT_VERSIONS)}")
    spec = f"{dist}=={version or DEFAULT_VERSIONS[dist]}"
    return Path(
        venv_build.build_venv(
            venv_build.cache_root("openenv") / spec.replace("==", "-") / "venv",
            base=lambda: venv_build.find_interpreter(PYTHON, spec),
            library=lambda: [spec],
            what=spec,
            key="packages",
            items=packages,
            stamp_fields={"openenv": spec},
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", default=DEFAULT_DIST, choices=sorted(DEFAULT_VERSIONS))
    parser.add_argument(
        "--version", help="the distribution's version (0.3.0 for openenv-core, 0.10.0 for openenv)"
    )
    parser.add_argument("--package", action="append", help="an environment package to install (repeatable)")
    parser.add_argument("--trl", action="store_true", help="add TRL and its trainer's needs (trl_packages)")
    args = parser.parse_args(argv)

    def make() -> Path:
        return venv(args.version, (*(args.package or ()), *(trl_packages() if args.trl else ())), args.dist)

    return int(venv_build.print_venv("openenv_venv", make))


if __name__ == "__main__":
    sys.exit(main())
