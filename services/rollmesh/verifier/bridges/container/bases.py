"""The daemonless provider's base images: `rollmesh-base:<suite>` is a Debian `<suite>` root
filesystem made once with debootstrap (minbase, with the same packages as deploy/local-docker.sh's
`rollmesh-base` Docker images: python3, venv, pip, CA certificates), from the mirror apt uses,
and cached under `$ROLLMESH_CACHE_DIR/container-bases/<suite>/rootfs` (default ~/.cache/rollmesh).
No registry is involved: a task naming another base (`ubuntu:24.04`) is mapped to one of these with
the image map, or fails its build by name.

Blocking (debootstrap takes minutes the first time): call off the event loop.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

from rollmesh.verifier.bridges.container.errors import ImageBuildFailed

PREFIX = "rollmesh-base:"
PACKAGES = "python3,python3-venv,python3-pip,ca-certificates"
_SUITE = re.compile(r"^[a-z][a-z0-9-]*$")


def cache_root() -> Path:
    base = os.environ.get("ROLLMESH_CACHE_DIR") or str(Path.home() / ".cache" / "rollmesh")
    return Path(base)


def is_local_base(image: str) -> bool:
    return image.startswith(PREFIX)


def rootfs(image: str, *, timeout_s: float = 1200.0) -> Path:
    """The root filesystem of `rollmesh-base:<suite>`, made on first use (under a lock)."""
    suite = image[len(PREFIX) :]
    if not _SUITE.match(suite):
        raise ImageBuildFailed(f"{image!r}: not a Debian suite name after {PREFIX!r}")
    folder = cache_root() / "container-bases" / suite
    done = folder / "rootfs"
    if (folder / "ready").is_file():
        return done
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "ready").is_file():
            return done
        if shutil.which("debootstrap") is None:
            raise ImageBuildFailed(
                f"{image}: no cached base at {done} and no debootstrap to make one "
                "(apt-get install debootstrap)"
            )
        staging = folder / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        log = folder / "debootstrap.log"
        argv = ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", suite, str(staging), mirror()]
        with open(log, "wb") as out:
            try:
                code = subprocess.run(
                    argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s
                ).returncode
            except subprocess.TimeoutExpired:
                code = -1
        if code != 0:
            shutil.rmtree(staging, ignore_errors=True)
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
            raise ImageBuildFailed(f"{image}: debootstrap {suite} failed ({tail[0][:200]}; see {log})")
        for junk in (staging / "var/cache/apt/archives", staging / "var/lib/apt/lists"):
            for item in junk.glob("*"):
                if item.is_file():
                    item.unlink()
        shutil.rmtree(done, ignore_errors=True)
        staging.rename(done)
        (folder / "ready").write_text(PACKAGES + "\n")
    return done


def mirror() -> str:
    """The Debian mirror apt uses (DEBIAN_MIRROR first), as deploy/local-docker.sh finds it."""
    if os.environ.get("DEBIAN_MIRROR"):
        return os.environ["DEBIAN_MIRROR"]
    try:
        for line in Path("/etc/apt/sources.list.d/debian.sources").read_text().splitlines():
            if line.startswith("URIs:") and line.split()[1:]:
                return line.split()[1]
    except OSError:
        pass
    return "http://deb.debian.org/debian"
