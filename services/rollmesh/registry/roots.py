"""The ordered artifact roots: working directory, ROLLMESH_EXTRA_ROOTS, then ROLLMESH_ROOT.

Roots with the same real path count once (the first position wins). Each root has the same
layout: environments/ benchmarks/ datasets/ configs/ prompts/ models/.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rollmesh.mesh import config

BUILTIN_ROOT = Path(__file__).resolve().parent.parent / "builtin"


@dataclass(frozen=True)
class Root:
    path: Path
    order: int
    source: str  # "cwd", "extra" or "root"


@dataclass(frozen=True)
class RootsConfig:
    """What decides the roots, read once from the environment."""

    cwd: Path
    extra: tuple[Path, ...]
    root: Path
    allow_override: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, cwd: Path | None = None) -> RootsConfig:
        extra_raw = str(config.read("ROLLMESH_EXTRA_ROOTS", environ))
        root_raw = str(config.read("ROLLMESH_ROOT", environ))
        return cls(
            cwd=(cwd or Path.cwd()),
            extra=tuple(Path(p).expanduser() for p in extra_raw.split(os.pathsep) if p.strip()),
            root=Path(root_raw).expanduser() if root_raw else BUILTIN_ROOT,
            allow_override=bool(config.read("ROLLMESH_ALLOW_ROOT_OVERRIDE", environ)),
        )


def ordered_roots(cfg: RootsConfig) -> list[Root]:
    """The roots in search order, deduplicated by real path (symlinks too); missing folders skipped."""
    candidates = [(cfg.cwd, "cwd"), *((p, "extra") for p in cfg.extra), (cfg.root, "root")]
    seen: set[Path] = set()
    roots: list[Root] = []
    for path, source in candidates:
        real = path.resolve()
        if real in seen or not real.is_dir():
            continue
        seen.add(real)
        roots.append(Root(path=real, order=len(roots), source=source))
    return roots


def install_sys_path(roots: list[Root]) -> None:
    """Make plugin modules in roots importable, earliest root first (so override mode is consistent)."""
    wanted = [str(r.path) for r in roots]
    sys.path[:] = wanted + [p for p in sys.path if p not in wanted]
