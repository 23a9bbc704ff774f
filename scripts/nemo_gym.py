"""NeMo Gym's own files, fetched from PyPI and cached, for the tests that run rollmesh on them.

    python scripts/nemo_gym.py data [--version 0.4.0]     # prints the folder holding resources_servers/

`data` downloads the nemo-gym wheel of that version (pure Python; no install, no interpreter of its
own needed) into the cache and unpacks its `resources_servers/` tree: each server's app.py, configs and
`data/example.jsonl` / `data/example_rollouts.jsonl` (the rows and the rewards NeMo Gym itself recorded).
Nothing of NeMo Gym's is committed to this repository: tests read it from here.

The cache is `$ROLLMESH_CACHE_DIR/nemo-gym/<version>/` (default `~/.cache/rollmesh`). Each step is
skipped when what it makes is there (a stamp file marks a finished unpack), runs under a file lock so
concurrent callers wait for one download, and unpacks into a temporary folder renamed into place, so
an interrupted run leaves nothing half-made. Exit status: 0 ready (the path on stdout), 1 a step failed
(one line on stderr says which).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_VERSION = "0.4.0"
# nemo-gym's Requires-Python: pip download checks it against the version it is told to target.
_TARGET_PYTHON = {"0.2": "3.12", "0.3": "3.12", "0.4": "3.12"}
_LATER_PYTHON = "3.13.14"
_SERVERS = "resources_servers/"


class NemoGymAssetError(RuntimeError):
    """A step of fetching NeMo Gym's files failed; the message says which, in one line."""


def cache_root() -> Path:
    base = os.environ.get("ROLLMESH_CACHE_DIR") or str(Path.home() / ".cache" / "rollmesh")
    return Path(base) / "nemo-gym"


def target_python(version: str) -> str:
    return _TARGET_PYTHON.get(".".join(version.split(".")[:2]), _LATER_PYTHON)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def wheel(version: str) -> Path:
    """The nemo-gym wheel of `version`, downloaded once into the cache."""
    folder = cache_root() / version / "wheel"
    found = sorted(folder.glob("nemo_gym-*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=cache_root() / version) as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--python-version", target_python(version), f"nemo-gym=={version}", "-d", tmp,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = sorted(Path(tmp).glob("nemo_gym-*.whl"))
        if done.returncode != 0 or not got:
            last = (done.stderr.strip().splitlines() or ["no wheel was downloaded"])[-1]
            raise NemoGymAssetError(f"pip could not download nemo-gym=={version}: {last}")
        folder.mkdir(parents=True, exist_ok=True)
        return Path(shutil.move(str(got[0]), folder / got[0].name))


def data(version: str = DEFAULT_VERSION) -> Path:
    """The folder holding NeMo Gym `version`'s `resources_servers/` tree (fetched and unpacked once)."""
    root = cache_root() / version
    out = root / "src"
    stamp = out / ".unpacked"
    if stamp.exists():
        return out
    with locked(root / ".lock"):
        if stamp.exists():
            return out
        whl = wheel(version)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix="src-"))
        try:
            with zipfile.ZipFile(whl) as zf:
                members = [n for n in zf.namelist() if n.startswith(_SERVERS)]
                if not members:
                    raise NemoGymAssetError(f"{whl.name} has no {_SERVERS} folder")
                zf.extractall(tmp, members)
            (tmp / ".unpacked").write_text(whl.name + "\n")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
        except (OSError, zipfile.BadZipFile) as exc:
            raise NemoGymAssetError(f"cannot unpack {whl}: {exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_data = sub.add_parser("data", help="fetch and unpack NeMo Gym's resources_servers/ tree")
    p_data.add_argument("--version", default=DEFAULT_VERSION)
    args = parser.parse_args(argv)
    try:
        print(data(args.version))
    except NemoGymAssetError as exc:
        print(f"nemo_gym: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
