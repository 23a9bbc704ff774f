"""Offset page tokens shared by every List RPC (opaque to clients, validated on the way in)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TypeVar

from rollmesh.mesh.errors import InvalidArgument

T = TypeVar("T")
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def decode_token(token: str) -> int:
    if not token:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token.encode()).decode()
        kind, _, value = raw.partition(":")
        offset = int(value)
        if kind != "o" or offset < 0:
            raise ValueError(raw)
    except ValueError:
        raise InvalidArgument(f"page_token {token!r} is not one this service issued") from None
    return offset


def page(items: Sequence[T], page_size: int, page_token: str) -> tuple[list[T], str]:
    """One page of `items` and the token of the next page ("" on the last)."""
    start = decode_token(page_token)
    end = start + (min(page_size, MAX_PAGE_SIZE) if page_size > 0 else DEFAULT_PAGE_SIZE)
    token = base64.urlsafe_b64encode(f"o:{end}".encode()).decode() if end < len(items) else ""
    return list(items[start:end]), token
