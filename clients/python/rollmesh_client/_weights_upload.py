"""The client side of UploadWeights: a checkpoint's files as a stream of pieces, each file's last
piece with the sha256 of the whole file (the gateway checks it). Files are read piece by piece in a
worker thread, so a large checkpoint is never held in memory twice nor read on the event loop."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollmesh_client.v1 import gateway_pb2 as pb

CHUNK_BYTES = 4 * 1024 * 1024  # well under the message limit (ROLLMESH_MAX_MESSAGE_MB, default 64)

FileSource = bytes | str | os.PathLike[str]


async def _pieces(source: FileSource, chunk_bytes: int) -> AsyncIterator[bytes]:
    if isinstance(source, bytes):
        for start in range(0, len(source), chunk_bytes):
            yield source[start : start + chunk_bytes]
        return
    with open(source, "rb") as f:  # noqa: ASYNC230 - every read below runs in a worker thread
        while chunk := await asyncio.to_thread(f.read, chunk_bytes):
            yield chunk


async def upload_requests(
    head: pb.UpdateWeightsRequest, files: Mapping[str, FileSource], *, chunk_bytes: int = CHUNK_BYTES
) -> AsyncIterator[pb.UploadWeightsRequest]:
    """`head` first, then every file of `files` (name -> bytes or a path) in pieces."""
    yield pb.UploadWeightsRequest(update=head)
    for name, source in files.items():
        digest = hashlib.sha256()
        pending = b""
        started = False
        async for chunk in _pieces(source, chunk_bytes):
            if started:
                yield pb.UploadWeightsRequest(file_name=name, data=pending)
            digest.update(chunk)
            pending, started = chunk, True
        yield pb.UploadWeightsRequest(file_name=name, data=pending, sha256=digest.hexdigest())


def folder_files(folder: str | os.PathLike[str]) -> dict[str, Path]:
    """The files of a checkpoint folder (not its subfolders), by name."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder")
    files = {p.name: p for p in sorted(root.iterdir()) if p.is_file()}
    if not files:
        raise ValueError(f"{root} holds no files to upload")
    return files


def state_dict_bytes(state_dict: Mapping[str, Any]) -> bytes:
    """A torch state dict as one safetensors file (tensors made contiguous, on CPU). Name the
    tensors as the served checkpoint does: a tied `lm_head.weight` that the served checkpoint leaves
    out must be left out here too (the gateway says which name is extra)."""
    from safetensors.torch import save

    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state_dict.items()}
    data: bytes = save(tensors, metadata={"format": "pt"})
    return data
