"""Strict decoding of what the sandbox sends back. Trusted side; no untrusted code runs here.

`decode_value` turns the wire form written by `_sandbox_runner.encode` into plain builtin data:
None, bool, int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset, dict,
`fractions.Fraction`, `decimal.Decimal`, `collections.deque`, `Counter`, `OrderedDict`, range,
dict views, an iterator over its items, and a namedtuple or defaultdict as a `Shaped` (never
rebuilt here), and nothing else. Exact JSON types
only (a subclass, an unknown tag, a NaN token, a wrong arity, an unhashable key, more than
`MAX_DEPTH` levels or `MAX_ITEMS` items, keys crafted to share a hash) raise `BadValue`, so a
value whose comparisons lie cannot exist on this side, and none costs more than linear time to
build (a Fraction's parts and a Decimal's digits and exponent are bounded so that reducing and
comparing them stays in milliseconds). `parse_frame` does the same for one reply frame.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections import OrderedDict
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from decimal import InvalidOperation
from fractions import Fraction
from keyword import iskeyword
from typing import Any

from rollmesh.verifier.errors import BadValue
from rollmesh.verifier.sandbox._sandbox_runner import FACTORIES

MAX_DEPTH = 64
MAX_ITEMS = 1_000_000
MAX_INT_HEX = 1 << 16  # hex digits of an int sent back: 262,144 bits. At 2**20 bits one `==` with a
# Decimal costs 2.0 s here, a gcd 2.6 s, a long division ~1 s: the event loop would stall
MAX_FRACTION_BITS = 1 << 16  # reducing two parts of n bits costs ~n**2: 2.6 s at 2**20 bits
MAX_DECIMAL_DIGITS = 1_000
MAX_DECIMAL_EXPONENT = 1_000  # a Decimal past it costs as much as its 10**exponent to compare exactly
_SEQUENCES: dict[str, type] = {
    "list": list,
    "tuple": tuple,
    "set": set,
    "frozenset": frozenset,
    "deque": deque,
}
REPLY_KEYS = frozenset(
    {"id", "error", "value", "changed", "stdout", "exit", "truncated", "names", "raised", "callback"}
    | {"call", "verdict"}
)


@dataclass(frozen=True)
class Shaped:
    """A namedtuple or a defaultdict as the verifier holds it: never rebuilt here (no class made
    from the solution's names, no factory), written again as it came (`sandbox_checks.replain`).
    `head`: (typename, fields), or the factory's wire form (None, ("builtin", name), a `Ref`);
    `body`: the items, a tuple or a dict."""

    tag: str
    head: Any
    body: Any


@dataclass(frozen=True)
class Ref:
    """An object of the solution's own, as its process named it (["ref", n]): never compared here."""

    index: int


MAX_SAME_HASH = 16


def check_hashes(keys: Iterable[Any]) -> None:
    """Refuse keys crafted to share a hash (ints congruent mod 2**61 - 1, say): a set or dict of
    them costs quadratic time to build, here on the verifier's event loop. Honest data never has
    more than a few keys with one hash."""
    counts: dict[int, int] = {}
    for key in keys:
        h = hash(key)
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_SAME_HASH:
            raise BadValue(f"more than {MAX_SAME_HASH} keys share one hash")


def checked_decimal(text: Any) -> Decimal:
    """A Decimal from its string, refused when its exponent or digits are so large that an exact
    comparison with an int or a Fraction would cost its 10**exponent."""
    if type(text) is not str or len(text) > MAX_DECIMAL_DIGITS + 20:
        raise BadValue("bad decimal")
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise BadValue("bad decimal") from None
    if value.is_finite() and abs(value.adjusted()) > MAX_DECIMAL_EXPONENT:
        raise BadValue(f"a decimal past 1e{MAX_DECIMAL_EXPONENT} is not checked")
    return value


def _reject_constant(token: str) -> Any:
    raise BadValue(f"non-standard JSON token {token}")


def parse_frame(data: bytes) -> dict[str, Any]:
    """One reply frame: a JSON object with only the known keys and an int "id"."""
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise BadValue(f"undecodable reply: {exc}") from None
    if type(obj) is not dict or type(obj.get("id")) is not int or not set(obj) <= REPLY_KEYS:
        raise BadValue("malformed reply")
    return obj


def decode_value(obj: Any, *, refs: bool = False) -> Any:
    """`refs`: ["ref", n] (an object of the solution's own) decodes to `Ref(n)`; else BadValue."""
    counter = [0]
    return _decode(obj, 0, counter, refs)


def _decode(obj: Any, depth: int, counter: list[int], refs: bool = False) -> Any:
    counter[0] += 1
    if depth > MAX_DEPTH or counter[0] > MAX_ITEMS:
        raise BadValue("value too deep or too large")
    kind = type(obj)
    if obj is None or kind in (bool, int, str):
        return obj
    if kind is float:
        if not math.isfinite(obj):
            raise BadValue("non-finite float outside its tag")
        return obj
    if kind is not list or len(obj) != 2 or type(obj[0]) is not str:
        raise BadValue(f"not a plain value: {type(obj).__name__}")
    tag, body = obj
    if refs and tag == "ref":
        if type(body) is not int or not 0 <= body < 1 << 31:
            raise BadValue("bad ref")
        return Ref(body)
    try:
        return _decode_tagged(tag, body, depth, counter, refs)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, BadValue):
            raise
        raise BadValue(f"bad {tag!r} value: {exc}") from None


def _decode_tagged(tag: str, body: Any, depth: int, counter: list[int], refs: bool) -> Any:
    if tag == "int":
        if type(body) is not str or not body or body.lstrip("-") == "" or len(body) > MAX_INT_HEX:
            raise BadValue("bad int")
        return int(body, 16)
    if tag == "fraction":
        if type(body) is not list or len(body) != 2:
            raise BadValue("bad fraction")
        num, den = (_decode(p, depth + 1, counter) for p in body)
        if type(num) is not int or type(den) is not int or den <= 0:
            raise BadValue("bad fraction")
        if max(num.bit_length(), den.bit_length()) > MAX_FRACTION_BITS:
            raise BadValue(f"a fraction of more than {MAX_FRACTION_BITS}-bit parts is not checked")
        return Fraction(num, den)
    if tag == "decimal":
        return checked_decimal(body)
    if tag == "float":
        if body not in ("nan", "inf", "-inf"):
            raise BadValue("bad float")
        return float(body)
    if tag == "complex":
        if type(body) is not list or len(body) != 2:
            raise BadValue("bad complex")
        parts = [_decode(p, depth + 1, counter) for p in body]
        if any(type(p) not in (int, float) for p in parts):
            raise BadValue("bad complex")
        return complex(parts[0], parts[1])
    if tag in ("bytes", "bytearray"):
        if type(body) is not str:
            raise BadValue("bad bytes")
        raw = bytes.fromhex(body)
        return raw if tag == "bytes" else bytearray(raw)
    if type(body) is not list:
        raise BadValue(f"bad {tag}")
    if tag in ("dict", "counter", "ordereddict"):
        pairs = _pairs(body, depth, counter, refs)
        return (
            OrderedDict(pairs)
            if tag == "ordereddict"
            else (Counter if tag == "counter" else dict)(dict(pairs))
        )
    if tag == "defaultdict":
        if len(body) != 2 or type(body[1]) is not list:
            raise BadValue("bad defaultdict")
        return Shaped(tag, _factory(body[0], refs), dict(_pairs(body[1], depth, counter, refs)))
    if tag == "namedtuple":
        return _namedtuple(body, depth, counter, refs)
    if tag == "range":
        parts = [_decode(p, depth + 1, counter) for p in body]
        if len(parts) != 3 or any(type(p) is not int for p in parts):
            raise BadValue("bad range")
        return range(*parts)
    if tag in _UNPACKED:
        items = [_decode(v, depth + 1, counter, refs) for v in body]
        if tag == "keys":
            check_hashes(items)
        if tag == "items":
            if any(type(i) is not tuple or len(i) != 2 for i in items):
                raise BadValue("bad dict items")
            check_hashes(k for k, _ in items)
        return _UNPACKED[tag](items)
    kind = _SEQUENCES.get(tag)
    if kind is None:
        raise BadValue(f"unknown tag {tag!r}")
    items = [_decode(v, depth + 1, counter, refs) for v in body]
    if kind in (set, frozenset):
        check_hashes(items)
    return kind(items)


_UNPACKED: dict[str, Any] = {
    "keys": lambda items: dict.fromkeys(items).keys(),
    "values": lambda items: dict(enumerate(items)).values(),
    "items": lambda items: dict(items).items(),
    "iterator": iter,
}
MAX_FIELDS = 1_000


def _pairs(body: list[Any], depth: int, counter: list[int], refs: bool) -> list[tuple[Any, Any]]:
    pairs = []
    for pair in body:
        if type(pair) is not list or len(pair) != 2:
            raise BadValue("bad dict item")
        key, value = (_decode(p, depth + 1, counter, refs) for p in pair)
        pairs.append((key, value))
    check_hashes(k for k, _ in pairs)
    return pairs


def _factory(wire: Any, refs: bool) -> Any:
    """A defaultdict's factory: None, a builtin type by name, or (in an answer) a reference."""
    if wire is None:
        return None
    if type(wire) is list and len(wire) == 2 and wire[0] == "builtin" and wire[1] in FACTORIES:
        return ("builtin", wire[1])
    if refs and type(wire) is list and len(wire) == 2 and wire[0] == "ref":
        return _decode(wire, 0, [0], refs)
    raise BadValue("bad defaultdict factory")


def _namedtuple(body: list[Any], depth: int, counter: list[int], refs: bool) -> Shaped:
    """[typename, fields, items]: an identifier that is not a keyword, as many short string
    fields as items (a field that is not an identifier is renamed where the class is made)."""
    if len(body) != 3 or type(body[1]) is not list or type(body[2]) is not list:
        raise BadValue("bad namedtuple")
    typename, fields, items = body
    if type(typename) is not str or not typename.isidentifier() or iskeyword(typename) or len(typename) > 200:
        raise BadValue("bad namedtuple name")
    if len(fields) != len(items) or len(fields) > MAX_FIELDS:
        raise BadValue("bad namedtuple fields")
    if any(type(f) is not str or not 0 < len(f) <= 200 for f in fields):
        raise BadValue("bad namedtuple fields")
    values = tuple(_decode(v, depth + 1, counter, refs) for v in items)
    return Shaped("namedtuple", (typename, tuple(fields)), values)
