"""A CPython newer than this machine's Debian has, taken from a newer Debian suite's binary packages
in minutes (building it from source takes 15-50): what scripts/nemo_gym.py uses for NeMo Gym >= 0.5,
which needs Python >= 3.13.14.

`root_python(want, who)` returns `find_interpreter(want)`, else makes, once, a minimal root of Debian
`SUITE` (forky ships python3.13 3.13.15) with debootstrap, the way deploy/local-docker.sh makes the
container base images, under `$ROLLMESH_CACHE_DIR/python/<suite>/` (as root: debootstrap needs it;
~2 minutes). Its interpreter then runs on this machine as it is, outside the root: a copy of it,
`usr/bin/python3`, is pointed (patchelf, the root's own) at the root's dynamic loader and libraries,
so the process runs wholly on the suite's libc and libraries while it reads and writes this
machine's files (no chroot: a virtualenv made with it, the scripts it runs and the folders they use
are plain host paths, and a sidecar started with it is confined as any other, launch/sidecar.py).
Two build settings that name /usr are pointed into the root too: the wheels `ensurepip` installs
pip from, and the header (pyconfig.h) a source distribution compiles against. Last,
`<cache>/python/<X.Y.Z>` links to the root's usr/, stamped as `find_interpreter` wants it: the root's
interpreter is found like one `scripts/nemo_gym.py python` built from source.

A file lock makes concurrent callers wait for one root; a root without its stamp (cut short) is made
again. Every failure is one line (AssetError); NoInterpreter when it cannot be made here (not root,
no debootstrap, or the suite's python3.X is older than `want`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from venv_build import STAMP_BUILT  # type: ignore[import-not-found]
from venv_build import AssetError  # type: ignore[import-not-found]
from venv_build import NoInterpreter  # type: ignore[import-not-found]
from venv_build import built_root  # type: ignore[import-not-found]
from venv_build import find_interpreter  # type: ignore[import-not-found]
from venv_build import locked  # type: ignore[import-not-found]
from venv_build import run_step  # type: ignore[import-not-found]
from venv_build import version_key  # type: ignore[import-not-found]

#: The Debian suite whose python3.X is new enough, and debootstrap's script for it (the script of
#: the suites after stable: bookworm's debootstrap has none named forky).
SUITE = "forky"
_SCRIPT = Path("/usr/share/debootstrap/scripts/sid")


def mirror() -> str:
    return os.environ.get("DEBIAN_MIRROR") or "http://deb.debian.org/debian"


def root_python(want: str, who: str) -> Path:
    """An interpreter >= `want` (`find_interpreter`), else the Debian root's (see the module doc)."""
    try:
        return Path(find_interpreter(want, who))
    except NoInterpreter:
        pass
    debootstrap = shutil.which("debootstrap")
    if os.geteuid() != 0 or debootstrap is None:
        why = "not root" if os.geteuid() != 0 else "no debootstrap (apt-get install debootstrap)"
        raise NoInterpreter(
            f"{who} needs Python >= {want}; none here, and a Debian {SUITE} root holding one "
            f"cannot be made ({why})"
        )
    minor = ".".join(want.split(".")[:2])
    with locked(built_root() / ".lock"):
        try:
            return Path(find_interpreter(want, who))  # another caller made it meanwhile
        except NoInterpreter:
            pass
        root = built_root() / SUITE
        shutil.rmtree(root, ignore_errors=True)
        packages = f"python{minor},python{minor}-venv,python{minor}-dev,patchelf"
        script = [str(_SCRIPT)] if _SCRIPT.is_file() else []
        cmd = [debootstrap, "--variant=minbase", f"--include={packages}", SUITE, str(root), mirror(), *script]
        try:
            run_step(cmd, None, f"debootstrap of Debian {SUITE} from {mirror()}")
            for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for item in (root / cache).glob("*"):
                    if item.is_file():
                        item.unlink()
            version = _chroot(
                root, f"python{minor}", "-c", "import platform; print(platform.python_version())"
            )
            if version_key(version) < version_key(want):
                raise NoInterpreter(
                    f"{who} needs Python >= {want}; Debian {SUITE}'s python{minor} is {version}"
                )
            _relocate(root, minor)
            (root / "usr" / STAMP_BUILT).write_text(f"python{minor} {version} (Debian {SUITE} root)\n")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        link = built_root() / version
        tmp = link.with_name(f".{version}.link")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(Path(SUITE) / "usr")
        if link.is_dir() and not link.is_symlink():
            shutil.rmtree(link)  # a source build of the same version, cut short (no stamp)
        tmp.rename(link)
    return Path(find_interpreter(want, who))


def _relocate(root: Path, minor: str) -> None:
    """`usr/bin/python3`: the root's python3.X made to run outside the root (see the module doc)."""
    # The loader's own file (its path's links resolved inside the root): a confined sidecar is
    # given the root's usr/ to read (mesh/confine.py program_paths), not the root's /lib64 link.
    named = _chroot(root, "patchelf", "--print-interpreter", f"/usr/bin/python{minor}")
    loader = os.path.realpath(f"{root}{named}")
    if not loader.startswith(os.path.realpath(root / "usr") + "/"):
        raise AssetError(f"Debian {SUITE}'s loader {named} is not inside the root's usr/ ({loader})")
    multiarch = _chroot(
        root, f"python{minor}", "-c", "import sysconfig; print(sysconfig.get_config_var('MULTIARCH'))"
    )
    shutil.copy2(root / "usr" / "bin" / f"python{minor}", root / "usr" / "bin" / "python3")
    # --no-sort: forky's patchelf 0.18, sorting the program headers, made a python that crashed.
    _chroot(
        root, "patchelf", "--no-sort", "--set-interpreter", loader, "--force-rpath",
        "--set-rpath", f"$ORIGIN/../lib/{multiarch}", "/usr/bin/python3",
    )  # fmt: skip
    stdlib = root / "usr" / "lib" / f"python{minor}"
    for data in stdlib.glob("_sysconfigdata_*.py"):
        text = re.sub(r"('WHEEL_PKG_DIR': ')(/usr/)", lambda m: f"{m[1]}{root}{m[2]}", data.read_text())
        data.write_text(text)
    include = root / "usr" / "include"
    shutil.copy2(
        include / multiarch / f"python{minor}" / "pyconfig.h", include / f"python{minor}" / "pyconfig.h"
    )
    python = root / "usr" / "bin" / "python3"
    check = "import ensurepip, ssl, sqlite3, ctypes, sys; print(sys.prefix)"
    done = subprocess.run([str(python), "-c", check], capture_output=True, text=True, check=False)
    if done.returncode != 0 or done.stdout.strip() != str(root / "usr"):
        last = (done.stderr.strip().splitlines() or [done.stdout.strip()])[-1]
        raise AssetError(f"Debian {SUITE}'s python{minor} does not run outside its root: {last}")


def _chroot(root: Path, *argv: str) -> str:
    out: str = run_step(["chroot", str(root), *argv], None, f"{argv[0]} in the Debian {SUITE} root")
    return out.strip()
