"""verl next to rollmesh's virtualenv, for the verl agent loop's contract test (rollmesh_client/verl.py).

    python scripts/verl_env.py [--version 0.9.1]   # prints a folder to put first on PYTHONPATH

verl 0.9.1 needs transformers < 5.11 (rollmesh runs 5.19) and the tokenizers and huggingface-hub
that transformers accepts, so it cannot go into rollmesh's virtualenv. It needs none of the heavy
packages it shares with rollmesh at other versions (torch, ray, numpy, pydantic are rollmesh's), so
instead of a second virtualenv with its own torch, this installs verl and exactly the packages that
must differ (or that rollmesh lacks) with `pip install --target` into
`$ROLLMESH_CACHE_DIR/verl/<version>/site` (default cache ~/.cache/rollmesh): a process that puts the
folder first on PYTHONPATH runs verl with rollmesh's torch and these; rollmesh's own virtualenv is
never touched. A stamp marks a finished install (made in a temporary folder renamed into place), and
a file lock makes concurrent callers wait for one build. Exit status: 0 ready (the folder on stdout),
1 a step failed (one line on stderr says which).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from venv_build import AssetError  # type: ignore[import-not-found]
from venv_build import locked  # type: ignore[import-not-found]
from venv_build import pip_install  # type: ignore[import-not-found]

__all__ = ["AssetError", "site"]

DEFAULT_VERSION = "0.9.1"
# What verl needs at other versions than rollmesh's, or that rollmesh lacks (its agent loop imports
# hydra, omegaconf, tensordict, codetiming, pylatexenc; transformers 5.10 wants tokenizers <= 0.23.0
# and huggingface-hub < 2).
OVERLAY = {
    "0.9.1": [
        "transformers==5.10.4",
        "tokenizers==0.22.2",
        "huggingface-hub==1.33.0",
        "hydra-core==1.3.8",
        "omegaconf==2.4.0",
        "antlr4-python3-runtime==4.9.3",
        "tensordict==0.10.0",
        "pyvers==0.2.3",
        "codetiming==1.4.0",
        "pylatexenc==2.11",
        "orjson==3.13.0",
    ]
}
STAMP = ".rollmesh-verl"


def cache_root() -> Path:
    base = os.environ.get("ROLLMESH_CACHE_DIR") or str(Path.home() / ".cache" / "rollmesh")
    return Path(base) / "verl"


def site(version: str = DEFAULT_VERSION) -> Path:
    """The folder holding verl `version` and its overlay (installed once; see the module)."""
    if version not in OVERLAY:
        raise AssetError(f"verl {version} has no overlay list here (known: {', '.join(OVERLAY)})")
    target = cache_root() / version / "site"
    with locked(cache_root() / version / ".lock"):
        if (target / STAMP).is_file():
            return target
        tmp = Path(tempfile.mkdtemp(prefix="site-", dir=target.parent))
        try:
            packages = [f"verl=={version}", *OVERLAY[version]]
            pip_install(
                Path(sys.executable), ["--no-deps", "--target", str(tmp), *packages], f"verl=={version}"
            )
            (tmp / STAMP).write_text("\n".join(packages) + "\n")
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=DEFAULT_VERSION)
    args = parser.parse_args(argv)
    try:
        print(site(args.version))
    except AssetError as exc:
        print(f"verl_env: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
