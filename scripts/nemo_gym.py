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

    python scripts/nemo_gym.py venv [--version 0.4.0] [--server NAME ...]   # prints its interpreter

`venv` builds a virtualenv for running NeMo Gym's resources servers themselves (the bridge's managed
mode, verifier/nemo_gym.py, and the compose stack's `nemo-gym` image, deploy/Dockerfile.nemo-gym):
the interpreter NeMo Gym needs (pyenv's 3.12 for 0.2-0.4; see `find_python`), nemo-gym from the
cached wheel and each named server's own requirements.txt (the tested servers by default). nemo-gym
pins its own openai, ray and mlflow, so it never shares rollmesh's virtualenv. The venv is
`<cache>/<version>/venv/`: a stamp lists what is installed, a server whose requirements are missing
is added, and the lock makes concurrent callers wait for one build (an interrupted build is found
without its stamp and made again). Exit status 3: no interpreter of the version NeMo Gym needs on
this machine (the tests skip, naming it).
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import json
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


# The servers the bridge's tests run (their requirements go into the venv by default).
TESTED_SERVERS = (
    "example_single_tool_call",
    "example_session_state_mgmt",
    "example_tool_call_multireward",
    "example_multi_step",
    "workplace_assistant",
    "math_advanced_calculations",
    "xlam_fc",
    "structured_outputs",
    "math_with_judge",
    "mcqa",
    "reasoning_gym",
    "example_multi_turn_gymnasium",
    "blackjack",
    "equivalence_rule",
    "format_verification",
    "arc_agi",
    "circle_count",
    "mrcr",
    "hotpotqa_qa",
    "bunsenbench_chemistry_mcq",
)
_PIP_TIMEOUT_S = 1800


class NoInterpreter(NemoGymAssetError):
    """No Python of the version this NeMo Gym needs exists on this machine."""


def find_python(version: str = DEFAULT_VERSION) -> Path:
    """An interpreter of the minor version nemo-gym `version` needs (`find_interpreter`)."""
    return find_interpreter(target_python(version), f"nemo-gym=={version}")


def find_interpreter(want: str, who: str) -> Path:
    """A Python >= `want`: `python3.X` on PATH (X: `want`'s minor), else pyenv's newest 3.X
    (`$PYENV_ROOT`, default ~/.pyenv), else `python3` on PATH when it is a later one (Debian trixie's
    3.13 in the `nemo-gym` container image, deploy/Dockerfile.nemo-gym). NoInterpreter (naming `who`
    needs it) when there is none."""
    minor = ".".join(want.split(".")[:2])
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [shutil.which(f"python{minor}")]
    candidates += sorted(glob.glob(str(pyenv / "versions" / f"{minor}.*" / "bin" / "python3")))[::-1]
    candidates.append(shutil.which("python3"))
    for path in (Path(c) for c in candidates if c):
        done = subprocess.run(
            [str(path), "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            check=False,
        )
        got = tuple(int(x) for x in done.stdout.split()) if done.returncode == 0 else ()
        if got[:1] == (3,) and got >= tuple(int(x) for x in want.split(".")):
            return path
    raise NoInterpreter(
        f"{who} needs Python >= {want}; no python{minor} on PATH or in {pyenv}/versions, "
        "and no later python3 on PATH"
    )


def server_requirements(version: str, server: str) -> list[str]:
    """A server's own requirements.txt lines (nemo-gym itself and comments left out)."""
    path = data(version) / _SERVERS / server / "requirements.txt"
    if not path.is_file():
        raise NemoGymAssetError(f"nemo-gym=={version} has no resources server {server!r} ({path} missing)")
    lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    return [
        ln for ln in lines if ln and not ln.startswith("-") and "nemo-gym" not in ln and "nemo_gym" not in ln
    ]


def _pip(python: Path, args: list[str], what: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=_PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise NemoGymAssetError(f"pip install of {what} took over {_PIP_TIMEOUT_S}s") from None
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        raise NemoGymAssetError(f"pip could not install {what}: {(errors or ['no output'])[-1]}")


def venv(version: str = DEFAULT_VERSION, servers: tuple[str, ...] = TESTED_SERVERS) -> Path:
    """The interpreter of a virtualenv with nemo-gym `version` and `servers`' requirements (made,
    or completed, once; see the module docstring)."""
    root = cache_root() / version
    folder = root / "venv"
    python = folder / "bin" / "python"
    stamp = folder / ".rollmesh-installed.json"

    def installed() -> set[str]:
        try:
            return set(json.loads(stamp.read_text())["servers"])
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    if stamp.exists() and set(servers) <= installed():
        return python
    base = find_python(version)
    with locked(root / ".venv.lock"):
        have = installed()
        if stamp.exists() and set(servers) <= have:
            return python
        if not stamp.exists():
            shutil.rmtree(folder, ignore_errors=True)
            done = subprocess.run(
                [str(base), "-m", "venv", str(folder)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise NemoGymAssetError(f"{base} -m venv {folder} failed: {done.stderr.strip()[-300:]}")
            _pip(python, [str(wheel(version))], f"nemo-gym=={version}")
        missing = sorted(set(servers) - have)
        reqs = sorted({r for s in missing for r in server_requirements(version, s)})
        if reqs:
            _pip(python, reqs, f"the requirements of {', '.join(missing)}")
        tmp = stamp.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"nemo_gym": version, "python": str(base), "servers": sorted(have | set(servers))})
        )
        tmp.rename(stamp)
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_data = sub.add_parser("data", help="fetch and unpack NeMo Gym's resources_servers/ tree")
    p_data.add_argument("--version", default=DEFAULT_VERSION)
    p_venv = sub.add_parser("venv", help="build (once) a virtualenv that runs NeMo Gym's resources servers")
    p_venv.add_argument("--version", default=DEFAULT_VERSION)
    p_venv.add_argument(
        "--server", action="append", help="a server whose requirements to install (repeatable)"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "venv":
            print(venv(args.version, tuple(args.server or TESTED_SERVERS)))
        else:
            print(data(args.version))
    except NoInterpreter as exc:
        print(f"nemo_gym: {exc}", file=sys.stderr)
        return 3
    except NemoGymAssetError as exc:
        print(f"nemo_gym: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
