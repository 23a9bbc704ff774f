"""gateway/uploads.py: staging a streamed checkpoint (bounds, order, digests) and deleting uploads
once they are no longer served, never a folder it did not stage."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollmesh.gateway.errors import UploadInvalid
from rollmesh.gateway.errors import UploadTooLarge
from rollmesh.gateway.uploads import UploadPiece
from rollmesh.gateway.uploads import WeightUploads


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def pieces(*items: UploadPiece) -> AsyncIterator[UploadPiece]:
    for item in items:
        yield item


async def test_pieces_of_each_file_are_joined_and_checked(tmp_path: Path) -> None:
    uploads = WeightUploads(tmp_path / "staging")
    folder = await uploads.stage(
        pieces(
            UploadPiece("a.bin", b"hello "),
            UploadPiece("a.bin", b"world", sha(b"hello world")),
            UploadPiece("b.json", b"{}", sha(b"{}")),
        ),
        limit_bytes=100,
    )
    assert folder.parent == tmp_path / "staging"
    assert (folder / "a.bin").read_bytes() == b"hello world" and (folder / "b.json").read_bytes() == b"{}"


@pytest.mark.parametrize(
    ("items", "error", "words"),
    [
        (
            (UploadPiece("a", b"x" * 60, sha(b"x" * 60)), UploadPiece("b", b"y" * 60, sha(b"y" * 60))),
            UploadTooLarge,
            "100 bytes",
        ),
        (
            (UploadPiece("a", b"x"), UploadPiece("b", b"y", sha(b"y"))),
            UploadInvalid,
            "a ended without its sha256",
        ),
        ((UploadPiece("a", b"x", sha(b"x")), UploadPiece("a", b"x", sha(b"x"))), UploadInvalid, "sent twice"),
        ((UploadPiece("sub/a", b"x", sha(b"x")),), UploadInvalid, "not a plain file name"),
        ((UploadPiece("..", b"x", sha(b"x")),), UploadInvalid, "not a plain file name"),
        ((UploadPiece("a", b"x", sha(b"y")),), UploadInvalid, "expected"),
        ((UploadPiece("a", b"x"),), UploadInvalid, "without its sha256"),
        ((), UploadInvalid, "no file"),
    ],
)
async def test_bad_uploads_are_refused_and_deleted(
    tmp_path: Path, items: tuple[UploadPiece, ...], error: type[Exception], words: str
) -> None:
    uploads = WeightUploads(tmp_path / "staging")
    with pytest.raises(error, match=words):
        await uploads.stage(pieces(*items), limit_bytes=100)
    assert list((tmp_path / "staging").iterdir()) == []


async def test_only_staged_uploads_are_ever_deleted(tmp_path: Path) -> None:
    uploads = WeightUploads(tmp_path / "staging")
    one = await uploads.stage(pieces(UploadPiece("a", b"1", sha(b"1"))), limit_bytes=10)
    two = await uploads.stage(pieces(UploadPiece("a", b"2", sha(b"2"))), limit_bytes=10)
    mine = tmp_path / "trainer-folder"
    mine.mkdir()
    await uploads.served("m", one)
    await uploads.served("m", two)  # one is no longer served
    assert not one.exists() and two.exists()
    await uploads.served("m", mine)  # a plain folder: two retires, the plain folder stays
    assert not two.exists() and mine.exists()
    await uploads.discard(mine)
    assert mine.exists()
    three = await uploads.stage(pieces(UploadPiece("a", b"3", sha(b"3"))), limit_bytes=10)
    await uploads.close()
    assert not three.exists() and mine.exists()
