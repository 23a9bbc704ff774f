"""Deterministic train / held-out split of the built-in ``arithmetic`` task.

A task is ``What is {a} + {b}?`` with ``a`` and ``b`` in ``0..99``; the reference answer
is ``str(a + b)``. About 10% of the 10,000 ordered pairs are held out: the shipped tiny
model (``models/tiny-arith``) was never trained on them, and the ``arithmetic`` benchmark
(``datasets/arithmetic/test.jsonl``) is drawn from them only.
"""

from __future__ import annotations

import hashlib

HELDOUT_MODULUS = 10


def is_heldout(a: int, b: int) -> bool:
    """Return True if the pair ``(a, b)`` belongs to the held-out (test) split.

    Pure and stable across Python versions and processes (no ``hash()`` salt).
    """
    digest = hashlib.sha256(f"{a},{b}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0
