"""A cached virtualenv for a foreign library, built once: what scripts/nemo_gym.py (`venv`),
scripts/verifiers_venv.py and scripts/agents_sdk_venv.py share.

`build_venv(folder, ...)` gives `folder/bin/python` of a virtualenv made with a base interpreter
(`find_interpreter`), the library installed first, then the named extra items (servers' requirements,
environment packages). A stamp (`.rollmesh-installed.json`) lists the items installed: an item that is
missing is added, an interrupted build (no stamp) is made again, and a file lock next to the folder
makes concurrent callers wait for one build. Every failure is an AssetError in one line;
NoInterpreter when the machine has no Python of the version needed.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path

PIP_TIMEOUT_S = 1800


def cache_root(name: str) -> Path:
    """`$ROLLMESH_CACHE_DIR/<name>` (default cache ~/.cache/rollmesh)."""
    base = os.environ.get("ROLLMESH_CACHE_DIR") or str(Path.home() / ".cache" / "rollmesh")
    return Path(base) / name


def print_venv(who: str, make: Callable[[], Path]) -> int:
    """A venv script's `main`: the interpreter `make()` gives on stdout and 0; else one line on
    stderr naming `who`, and 3 (no interpreter of the version needed) or 1 (a step failed)."""
    import sys

    try:
        print(make())
    except NoInterpreter as exc:
        print(f"{who}: {exc}", file=sys.stderr)
        return 3
    except AssetError as exc:
        print(f"{who}: {exc}", file=sys.stderr)
        return 1
    return 0


class AssetError(RuntimeError):
    """A step of fetching or installing a foreign library failed; the message says which, in one line."""


class NoInterpreter(AssetError):
    """No Python of the version the library needs exists on this machine."""


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


#: Marks a CPython that scripts/nemo_gym.py `python` finished installing under `built_root()`.
STAMP_BUILT = ".rollmesh-built"


def built_root() -> Path:
    """Where scripts/nemo_gym.py `python` installs the CPythons it builds (`$ROLLMESH_CACHE_DIR/python`)."""
    return Path(os.environ.get("ROLLMESH_CACHE_DIR") or Path.home() / ".cache" / "rollmesh") / "python"


def version_key(path: str) -> tuple[int, ...]:
    """The version a path names (its last part that starts with a digit), for sorting."""
    part = next((p for p in Path(path).parts[::-1] if p[:1].isdigit()), "0")
    return tuple(int(x) if x.isdigit() else 0 for x in part.split("."))


def find_interpreter(want: str, who: str) -> Path:
    """A Python >= `want`: `python3.X` on PATH (X: `want`'s minor), else pyenv's newest 3.X
    (`$PYENV_ROOT`, default ~/.pyenv), else the newest 3.X scripts/nemo_gym.py `python` built (under
    `built_root()`, stamped), else `python3` on PATH when it is a later one (Debian trixie's 3.13 in
    the `nemo-gym` container image, deploy/Dockerfile.nemo-gym). NoInterpreter (naming `who` needs
    it) when there is none."""
    minor = ".".join(want.split(".")[:2])
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates = [shutil.which(f"python{minor}")]
    candidates += sorted(
        glob.glob(str(pyenv / "versions" / f"{minor}.*" / "bin" / "python3")), key=version_key
    )[::-1]
    built = sorted(glob.glob(str(built_root() / f"{minor}.*" / STAMP_BUILT)), key=version_key)[::-1]
    # Its real folder (a Debian root's usr/ is linked there, scripts/debian_root.py): a virtualenv
    # made with it names that folder, which a confined sidecar is given to read (mesh/confine.py).
    candidates += [str(Path(os.path.realpath(Path(b).parent)) / "bin" / "python3") for b in built]
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
        f"{who} needs Python >= {want}; no python{minor} on PATH, in {pyenv}/versions or {built_root()}, "
        "and no later python3 on PATH (`scripts/nemo_gym.py python --version <nemo-gym version>` builds one)"
    )


#: How long one step of making an interpreter may take (a download, a build, a debootstrap).
STEP_TIMEOUT_S = 3600


def run_step(cmd: list[str], cwd: Path | None, what: str) -> str:
    """`cmd`'s stdout; AssetError naming `what` (or the command) and its last line of error."""
    try:
        done = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, check=False, timeout=STEP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise AssetError(f"{what or cmd[0]} took over {STEP_TIMEOUT_S}s") from None
    if done.returncode != 0:
        last = ([ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()] or ["no output"])[-1]
        raise AssetError(f"{what or ' '.join(cmd[:3])} failed: {last}")
    return done.stdout


def pip_install(python: Path, args: list[str], what: str) -> None:
    """`python -m pip install args`; AssetError naming `what` and pip's last error line."""
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssetError(f"pip install of {what} took over {PIP_TIMEOUT_S}s") from None
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
        raise AssetError(f"pip could not install {what}: {(errors or ['no output'])[-1]}")


def build_venv(
    folder: Path,
    *,
    base: Callable[[], Path],
    library: Callable[[], list[str]],
    what: str,
    key: str,
    items: tuple[str, ...],
    requirements: Callable[[list[str]], list[str]] = list,
    stamp_fields: Mapping[str, str] | None = None,
) -> Path:
    """The interpreter of the virtualenv at `folder` (see the module docstring): made with `base()`,
    `library()` (pip arguments; `what` names them) installed first, then `requirements(missing)` for the
    `items` the stamp (its list under `key`, next to `stamp_fields`) does not list yet."""
    python = folder / "bin" / "python"
    stamp = folder / ".rollmesh-installed.json"

    def installed() -> set[str]:
        try:
            return set(json.loads(stamp.read_text())[key])
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    if stamp.exists() and set(items) <= installed():
        return python
    interpreter = base()
    with locked(folder.parent / ".venv.lock"):
        have = installed()
        if stamp.exists() and set(items) <= have:
            return python
        if not stamp.exists():
            shutil.rmtree(folder, ignore_errors=True)
            done = subprocess.run(
                [str(interpreter), "-m", "venv", str(folder)], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise AssetError(f"{interpreter} -m venv {folder} failed: {done.stderr.strip()[-300:]}")
            pip_install(python, library(), what)
        missing = sorted(set(items) - have)
        reqs = requirements(missing)
        if reqs:
            pip_install(python, reqs, ", ".join(missing))
        tmp = stamp.with_suffix(".tmp")
        fields = {**(stamp_fields or {}), "python": str(interpreter), key: sorted(have | set(items))}
        tmp.write_text(json.dumps(fields))
        tmp.rename(stamp)
    return python
