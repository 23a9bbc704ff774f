"""`encoder(...)`: `json.JSONEncoder(..., check_circular=False).encode` with its C encoder made once.

`JSONEncoder.encode` builds the C encoder (and a float formatter closure) on every call: ~0.5 us, on
each of a rollout's row (sinks/jsonl.py) and each task text the verifier is sent (remote.py). The C
encoder holds only its settings (no circular-reference markers here), so one serves every call. The
same text and the same errors as the JSONEncoder's `encode` (its own path for a top-level string
included); without CPython's C accelerator it is that `encode`.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any


def encoder(*, ensure_ascii: bool = True, separators: tuple[str, str] | None = None) -> Callable[[Any], str]:
    base = json.JSONEncoder(ensure_ascii=ensure_ascii, separators=separators, check_circular=False)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return base.encode
    encode_string = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    c_encode = make(
        None,  # no markers: check_circular=False
        base.default,
        encode_string,
        None,  # indent
        base.key_separator,
        base.item_separator,
        base.sort_keys,
        base.skipkeys,
        base.allow_nan,
    )

    def encode(o: Any) -> str:
        if isinstance(o, str):
            return base.encode(o)
        return "".join(c_encode(o, 0))

    return encode
