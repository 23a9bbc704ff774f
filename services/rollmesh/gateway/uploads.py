"""Checkpoints streamed to the gateway (UploadWeights): staged on disk, checked, kept while served.

Contract:
  - `WeightUploads(root)` stages each upload in a fresh folder under `root` (created on demand).
    The folder is what the replicas load, so on a multi-node Ray cluster `root` must be a path every
    replica host reads (`ROLLMESH_WEIGHTS_STAGING_DIR` on a shared mount); on one machine the
    default temp folder works.
  - `stage(pieces, limit_bytes=...)` writes the pieces (each file's pieces in order, one file after
    another) and returns the folder. It refuses, with INVALID_ARGUMENT / `UPLOAD_INVALID` and the
    folder deleted: a file name that is not a plain name, a file sent twice or interleaved, a file
    whose last piece carries no sha256 or a wrong one, an upload with no file. It refuses with
    RESOURCE_EXHAUSTED / `UPLOAD_TOO_LARGE` (folder deleted) once the bytes pass `limit_bytes`.
    Disk writes and hashing run in a worker thread, never on the loop.
  - After any update, `served(model, folder)` records that `model` serves `folder` and deletes the
    upload it served before; `discard(folder)` deletes a folder whose update failed. Only folders
    staged here are ever deleted. An upload stays
    on disk while it is the served weights: a replica Serve starts later loads it (serving/
    weights_record.py), and a failed update rolls back to it. `close()` deletes every staged folder.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rollmesh.gateway.errors import UploadInvalid
from rollmesh.gateway.errors import UploadTooLarge
from rollmesh.mesh.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class UploadPiece:
    """A piece of one file of a streamed checkpoint; `sha256` is set on the file's last piece."""

    file_name: str
    data: bytes
    sha256: str = ""


def _plain_name(name: str) -> bool:
    return (
        bool(name) and name not in {".", ".."} and "/" not in name and "\\" not in name and "\0" not in name
    )


class _FileWriter:
    """One file being written: its handle, running digest and size."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = hashlib.sha256()
        self.size = 0
        self._file: IO[bytes] = path.open("xb")

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self.digest.update(data)
        self.size += len(data)

    def close(self) -> None:
        self._file.close()


class WeightUploads:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._served: dict[str, Path] = {}  # model -> the staged folder it serves
        self._staged: set[Path] = set()

    async def stage(self, pieces: AsyncIterator[UploadPiece], *, limit_bytes: int) -> Path:
        folder = await asyncio.to_thread(self._new_folder)
        try:
            await self._write_all(folder, pieces, limit_bytes)
        except BaseException:
            await self.discard(folder)
            raise
        return folder

    def _new_folder(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="upload-", dir=self.root))
        self._staged.add(folder)
        return folder

    async def _write_all(self, folder: Path, pieces: AsyncIterator[UploadPiece], limit_bytes: int) -> None:
        done: set[str] = set()
        current: _FileWriter | None = None
        total = 0
        try:
            async for piece in pieces:
                name = piece.file_name
                if current is not None and name != current.path.name:
                    raise UploadInvalid(
                        f"file {current.path.name} ended without its sha256 (its last piece carries it)",
                        metadata={"file": current.path.name},
                    )
                if current is None:
                    if not _plain_name(name):
                        raise UploadInvalid(
                            f"file name {name!r} is not a plain file name", metadata={"file": name}
                        )
                    if name in done:
                        raise UploadInvalid(f"file {name} was sent twice", metadata={"file": name})
                    current = await asyncio.to_thread(_FileWriter, folder / name)
                total += len(piece.data)
                if total > limit_bytes:
                    raise UploadTooLarge(
                        f"the upload passed {limit_bytes} bytes (the served checkpoint's size plus a margin)",
                        metadata={"limit_bytes": str(limit_bytes)},
                    )
                if piece.data:
                    await asyncio.to_thread(current.write, piece.data)
                if piece.sha256:
                    await asyncio.to_thread(current.close)
                    got = current.digest.hexdigest()
                    if got != piece.sha256.lower():
                        raise UploadInvalid(
                            f"file {name}: sha256 {got} of the {current.size} bytes received, "
                            f"expected {piece.sha256}",
                            metadata={"file": name},
                        )
                    done.add(name)
                    current = None
        finally:
            if current is not None:
                await asyncio.to_thread(current.close)
        if current is not None:
            raise UploadInvalid(
                f"file {current.path.name} ended without its sha256", metadata={"file": current.path.name}
            )
        if not done:
            raise UploadInvalid("the upload holds no file")
        log.info("weights_upload_staged", folder=str(folder), files=sorted(done), bytes=total)

    async def served(self, model: str, folder: Path) -> None:
        """`model` now serves `folder` (staged here or not): delete the upload it served before."""
        previous = self._served.pop(model, None)
        if folder in self._staged:
            self._served[model] = folder
        if previous is not None and previous != folder:
            await self.discard(previous)

    async def discard(self, folder: Path) -> None:
        """Delete `folder` if this object staged it (never anything else)."""
        if folder in self._staged:
            self._staged.discard(folder)
            await asyncio.to_thread(shutil.rmtree, folder, True)

    async def close(self) -> None:
        for folder in list(self._staged):
            await self.discard(folder)
        self._served.clear()
