"""A virtualenv with the OpenAI Agents SDK (`openai-agents`), for running examples/agents/agents_sdk_agent.py
as an agent program and for the tests that do.

    python scripts/agents_sdk_venv.py [--version 0.24.0]   # prints its interpreter

openai-agents 0.24 pins websockets < 17 (rollmesh's virtualenv has 17.4, for the gateway's and Ray's
own use): it never shares rollmesh's virtualenv, as verifiers and NeMo Gym do not
(scripts/verifiers_venv.py, scripts/nemo_gym.py). The venv is
`$ROLLMESH_CACHE_DIR/openai-agents/<version>/venv/` (default cache ~/.cache/rollmesh), made with Python
3.11 (`python3.11` on PATH or pyenv's) by scripts/venv_build.py: a stamp marks a finished build, an
interrupted one is made again, and a file lock makes concurrent callers wait for one build. Exit
status: 0 ready (the interpreter's path on stdout), 1 a step failed, 3 no Python 3.11 on this machine
(one line on stderr says which).
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

DEFAULT_VERSION = "0.24.0"
PYTHON = "3.11.0"


def venv(version: str = DEFAULT_VERSION) -> Path:
    """The interpreter of a virtualenv with openai-agents `version` (made once; module docstring)."""
    return Path(
        build_venv(
            cache_root("openai-agents") / version / "venv",
            base=lambda: find_interpreter(PYTHON, f"openai-agents=={version}"),
            library=lambda: [f"openai-agents=={version}"],
            what=f"openai-agents=={version}",
            key="packages",
            items=(),
            stamp_fields={"openai-agents": version},
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=DEFAULT_VERSION)
    args = parser.parse_args(argv)
    return int(print_venv("agents_sdk_venv", lambda: venv(args.version)))


if __name__ == "__main__":
    sys.exit(main())
