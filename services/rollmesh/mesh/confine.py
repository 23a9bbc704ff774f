"""Confined children: the one way rollmesh runs a program it does not trust that is not Python under
test (that is the verifier's code sandbox, verifier/sandbox/core.py). External agent programs
(scheduler/drivers/program.py) and managed environment servers (launch/sidecar.py: NeMo Gym resources
servers, verifiers environments) start as `command(argv, confinement, mode_file)`, which runs
mesh/_confine.py (standard library only) before `argv`; its docstring is the contract.

What held is written to `mode_file` and read back with `read_mode`: "+"-joined from "uid", "mount",
"pid", "network" (for example "uid+mount+pid"), or "limits" when nothing but rlimits (and the
session, the death signal) held. As root with `uid` set (`UidLeases.lease`), a child gets a uid of
its own from the sandbox block (mesh/uids.py, leased host-wide), read-only mounts with fresh scratch
tmpfs, only `readable` (read-only) and `writable` paths where the rest is closed to other users, and
its own pid namespace (pid 2 there, under a minimal init; everything it starts dies with it).
Elsewhere (not root) it runs as this process's user, with only what the kernel allowed (a network
namespace needs CAP_SYS_ADMIN).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh.mesh.uids import UidPool

CONFINE = Path(__file__).with_name("_confine.py")
LIMITS_MODE = "limits"
_KNOWN = ("uid", "mount", "pid", "network")


@dataclass(frozen=True)
class Confinement:
    """What a confined child gets. `uid` None: no uid, mount or pid namespace of its own. `forward`
    not None: a network namespace whose loopback serves those `[port, unix_socket]` pairs, and
    whose `expose` ports (`[port, unix_socket]`) this process reaches through those Unix sockets."""

    rlimits: Mapping[str, int] = field(default_factory=dict)
    uid: int | None = None
    readable: Sequence[str] = ()
    writable: Sequence[str] = ()
    #: Paths it must not read even where other users may (a job's dataset and output folder, which
    #: hold the gold): an empty folder or file in their place (uid mode; `readable` wins).
    hidden: Sequence[str] = ()
    forward: list[list[Any]] | None = None
    expose: list[list[Any]] = field(default_factory=list)
    scratch_mb: int = 256


def command(argv: Sequence[str], confinement: Confinement, mode_file: Path) -> list[str]:
    """The command line running `argv` confined (the caller makes it a session leader)."""
    return [sys.executable, str(CONFINE), json.dumps(settings(confinement, mode_file)), "--", *argv]


def settings(confinement: Confinement, mode_file: Path, parent: int | None = None) -> dict[str, Any]:
    """mesh/_confine.py's settings for `confinement` (its `enter` runs them): `parent` is the
    process whose death ends the child (this one by default)."""
    out: dict[str, Any] = {
        "parent": os.getpid() if parent is None else parent,
        "rlimits": dict(confinement.rlimits),
        "mode_file": str(mode_file),
    }
    if confinement.forward is not None:
        out["network"] = {"forward": confinement.forward, "expose": confinement.expose}
    if confinement.uid is not None:
        out.update(
            uid=confinement.uid,
            readable=list(confinement.readable),
            writable=list(confinement.writable),
            hidden=list(confinement.hidden),
            scratch_mb=confinement.scratch_mb,
        )
    return out


def read_mode(path: Path) -> str:
    """What held for a child, from its mode file ("limits" when the wrapper never got that far or
    wrote something else). Blocking (small file): call it off the loop."""
    try:
        held = path.read_text().strip().split("+")
    except FileNotFoundError:
        return LIMITS_MODE
    return "+".join(h for h in _KNOWN if h in held) or LIMITS_MODE


class ShimUnresolved(ValueError):
    """A command that is a version manager's shim (pyenv) whose interpreter could not be found."""


def _pyenv_root(exe: str) -> Path | None:
    """The pyenv root when `exe` is one of its shims (`<root>/shims/<name>`, a script that execs
    `<root>/libexec/pyenv exec`), else None."""
    path = Path(exe)
    root = path.parent.parent
    if path.parent.name != "shims" or not (root / "libexec" / "pyenv").is_file():
        return None
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    return root if b"libexec/pyenv" in head and b" exec " in head else None


def resolve_shim(argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """`argv` with a pyenv shim as its command (`python` on a PATH where pyenv's shims come first)
    replaced by the interpreter that shim runs here (`pyenv which`, in this folder and `env`: the
    version PYENV_VERSION, a .python-version or the global one names). A shim cannot run confined:
    it execs pyenv's own files, which a program's mount namespace does not show, and it picks its
    version from the folder it runs in. Raises ShimUnresolved, saying what to pass instead, when
    pyenv names no interpreter. Blocking (runs pyenv): call it off the loop."""
    if not argv:
        return []
    environ = dict(os.environ if env is None else env)
    found = shutil.which(argv[0], path=environ.get("PATH"))
    root = _pyenv_root(os.path.abspath(found)) if found else None
    if root is None:
        return list(argv)
    name = Path(str(found)).name
    try:
        done = subprocess.run(
            [str(root / "libexec" / "pyenv"), "which", name],
            capture_output=True,
            text=True,
            env={**environ, "PYENV_ROOT": str(root)},
            timeout=60,
            check=False,
        )
        said, real = (done.stderr.strip().splitlines() or [""])[0], done.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        said, real = str(exc), ""
    if not real or not os.path.isfile(real):
        raise ShimUnresolved(
            f"{argv[0]!r} is a pyenv shim ({found}) and `pyenv which {name}` names no interpreter "
            f"here ({said or 'no output'}): pass an interpreter's path instead of {argv[0]!r}, such as "
            f"a virtualenv's bin/{name} or what `pyenv which {name}` prints where your program runs"
        )
    return [real, *argv[1:]]


def program_paths(argv: Sequence[str], path_env: str | None = None) -> list[str]:
    """What running `argv` needs to read: its executable (looked up on `path_env`), the virtualenv
    it belongs to (a `pyvenv.cfg` beside its bin/) and the prefix its real file lives in (an
    interpreter's lib/ beside its bin/), and every argument that is an absolute existing path."""
    found = shutil.which(argv[0], path=path_env) if argv else None
    paths: list[str] = []
    if found:
        exe = Path(os.path.abspath(found))
        paths.append(str(exe))
        for candidate in (exe.parent.parent, Path(os.path.realpath(exe)).parent.parent):
            if (candidate / "pyvenv.cfg").is_file() or (candidate / "lib").is_dir():
                paths.append(str(candidate))
                paths += pth_paths(candidate)
        paths.append(os.path.realpath(exe))
    paths += [a for a in argv[1:] if os.path.isabs(a) and os.path.exists(a)]
    return list(dict.fromkeys(paths))


def pth_paths(prefix: Path) -> list[str]:
    """The folders the `.pth` files of `prefix`'s site-packages put on sys.path (an overlay
    virtualenv reaching another one's packages): existing absolute paths, or relative to the
    site-packages folder; `import` lines (code, not a path) are not read."""
    found: list[str] = []
    for pth in sorted(prefix.glob("lib/python3*/site-packages/*.pth")):
        try:
            lines = pth.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            entry = line.strip()
            if not entry or entry.startswith(("#", "import ", "import\t")):
                continue
            target = Path(entry) if os.path.isabs(entry) else pth.parent / entry
            if target.is_dir():
                found.append(os.path.realpath(target))
    return found


class UidLeases:
    """Uids for confined children: from the sandbox block, leased host-wide (mesh/uids.py); none
    when this process is not root (a child then runs as this user)."""

    def __init__(self) -> None:
        self._pool = UidPool()
        self._ready = False

    async def lease(self) -> int | None:
        if os.geteuid() != 0:
            return None
        if not self._ready:
            await asyncio.to_thread(self._pool.use_leases)
            self._ready = True
        return await self._pool.lease()

    def release(self, uid: int | None) -> None:
        if uid is not None:
            self._pool.release(uid)
