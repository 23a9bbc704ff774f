"""Finding, listing, digesting and reading artifacts across the ordered roots."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from rollmesh.registry.errors import ArtifactCollision
from rollmesh.registry.errors import ArtifactNotFound
from rollmesh.registry.errors import BadArtifactName
from rollmesh.registry.errors import UnknownKind
from rollmesh.registry.roots import Root
from rollmesh.registry.roots import RootsConfig
from rollmesh.registry.roots import ordered_roots

MAX_NAME_LEN = 255
_IGNORED_SUFFIXES = (".py", ".pyc")


class Kind(StrEnum):
    ENVIRONMENT = "environments"
    BENCHMARK = "benchmarks"
    DATASET = "datasets"
    CONFIG = "configs"
    PROMPT = "prompts"
    MODEL = "models"

    @classmethod
    def parse(cls, raw: str) -> Kind:
        """Accept the folder name or its singular ("dataset" or "datasets")."""
        value = raw.strip().lower()
        for kind in cls:
            if value in (kind.value, kind.value.rstrip("s")):
                return kind
        allowed = ", ".join(k.value.rstrip("s") for k in cls)
        raise UnknownKind(f"unknown artifact kind {raw!r}; use one of: {allowed}")


@dataclass(frozen=True)
class Listed:
    """An artifact as found in one root (no digest)."""

    kind: Kind
    name: str
    path: Path
    root: Path
    is_dir: bool
    collides_with: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Resolved(Listed):
    """A located artifact and its digest (a folder's: of its manifest of `files`)."""

    sha256: str = ""
    size_bytes: int = 0
    files: tuple[str, ...] = ()


def validate_name(name: str) -> str:
    """A plain name: non-empty, no separators, no '..', no NUL, not absolute, at most 255 chars."""
    if not name or not name.strip():
        raise BadArtifactName("artifact name is empty; give a plain name such as 'arithmetic'")
    problems = []
    if "\x00" in name:
        problems.append("a NUL byte")
    if "/" in name or "\\" in name or os.sep in name:
        problems.append("a path separator")
    if ".." in name:
        problems.append("'..'")
    if os.path.isabs(name):
        problems.append("an absolute path")
    if len(name) > MAX_NAME_LEN:
        problems.append(f"more than {MAX_NAME_LEN} characters")
    if problems:
        raise BadArtifactName(
            f"artifact name {name!r} has {', '.join(problems)}; names are plain folder or file names "
            "(letters, digits, '-', '_', '.') without a path"
        )
    return name


def _entry_name(entry: Path) -> str | None:
    if entry.name.startswith((".", "_")) or entry.name.endswith(_IGNORED_SUFFIXES):
        return None
    if entry.is_file() and entry.stem.lower() == "readme":  # a root's documentation, not an artifact
        return None
    return entry.name if entry.is_dir() else entry.stem


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
    except ValueError:
        return False
    return True


class Catalog:
    """Every artifact across the roots. Strict: a name in two places is ArtifactCollision."""

    def __init__(self, roots: list[Root], *, allow_override: bool = False) -> None:
        self.roots = roots
        self.allow_override = allow_override

    @classmethod
    def from_config(cls, cfg: RootsConfig) -> Catalog:
        return cls(ordered_roots(cfg), allow_override=cfg.allow_override)

    def _candidates(self, kind: Kind) -> dict[str, list[tuple[Path, Root]]]:
        found: dict[str, list[tuple[Path, Root]]] = {}
        for root in self.roots:
            folder = root.path / kind.value
            if not folder.is_dir():
                continue
            for entry in sorted(folder.iterdir()):
                name = _entry_name(entry)
                if name is None or not _inside(entry, root.path):
                    continue
                found.setdefault(name, []).append((entry, root))
        return found

    def list_artifacts(self, kind: Kind | None = None) -> list[Listed]:
        """Artifacts sorted by kind then name, one row per name (the earliest root's copy)."""
        rows: list[Listed] = []
        for k in [kind] if kind else list(Kind):
            for name, places in sorted(self._candidates(k).items()):
                path, root = places[0]
                rows.append(Listed(k, name, path, root.path, path.is_dir(), tuple(p for p, _ in places[1:])))
        return rows

    def locate(self, kind: Kind, name: str) -> Listed:
        """The one place `name` lives, or ArtifactNotFound / ArtifactCollision."""
        validate_name(name)
        places = self._candidates(kind).get(name, [])
        if not places:
            roots = ", ".join(str(r.path) for r in self.roots) or "(none)"
            raise ArtifactNotFound(
                f"no {kind.value.rstrip('s')} named {name!r} in any root ({roots})",
                metadata={"kind": kind.value, "name": name},
            )
        if len(places) > 1 and not self.allow_override:
            paths = [str(p) for p, _ in places]
            raise ArtifactCollision(
                f"{kind.value.rstrip('s')} {name!r} is defined in {len(paths)} places: {', '.join(paths)}; "
                "remove or rename one, or set ROLLMESH_ALLOW_ROOT_OVERRIDE=1 to let the earliest root win",
                metadata={"kind": kind.value, "name": name, **{f"path_{i}": p for i, p in enumerate(paths)}},
            )
        path, root = places[0]
        return Listed(kind, name, path, root.path, path.is_dir(), tuple(p for p, _ in places[1:]))

    def resolve(self, kind: Kind, name: str) -> Resolved:
        """Locate and digest (blocking file I/O: call off the event loop)."""
        found = self.locate(kind, name)
        if not found.is_dir:
            digest, size = file_digest(found.path)
            return Resolved(**vars(found), sha256=digest, size_bytes=size)
        files = list(iter_files(found.path, found.root))
        manifest = hashlib.sha256()
        total = 0
        for rel in files:
            digest, size = file_digest(found.path / rel)
            manifest.update(f"{rel}\0{digest}\n".encode())
            total += size
        return Resolved(**vars(found), sha256=manifest.hexdigest(), size_bytes=total, files=tuple(files))

    def file_in(self, artifact: Listed, rel: str) -> Path:
        """A file inside a directory artifact, refusing anything that escapes it."""
        if not rel or "\x00" in rel or os.path.isabs(rel) or ".." in Path(rel).parts:
            raise BadArtifactName(f"file {rel!r} must be a relative path inside the artifact, without '..'")
        target = (artifact.path / rel).resolve()
        if not _inside(target, artifact.path.resolve()) or not target.is_file():
            raise ArtifactNotFound(f"{artifact.name!r} has no file {rel!r}")
        return target


def iter_files(folder: Path, root: Path) -> Iterator[str]:
    """Relative paths of every regular file under `folder`, sorted, never leaving `root`."""
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fname in sorted(filenames):
            full = Path(dirpath) / fname
            if full.is_file() and _inside(full, root) and not fname.endswith(".pyc"):
                yield str(full.relative_to(folder))


def file_digest(path: Path) -> tuple[str, int]:
    """sha256 (hex) and size of the bytes read, in one pass."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest(), f.tell()


def read_chunks(path: Path, chunk_size: int) -> Iterator[tuple[int, bytes]]:
    offset = 0
    with path.open("rb") as f:
        while chunk := f.read(chunk_size):
            yield offset, chunk
            offset += len(chunk)
