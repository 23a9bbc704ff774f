"""The verifier's side of a verdict: the strict value decoder, what may cross between the clean
interpreter and the solution's process (`sandbox_checks`), and how the clean interpreter counts
asserts. The processes themselves run in tests/integration/test_code_forgery.py and
test_code_clean_interpreter.py."""

from __future__ import annotations

import ast
import json
from collections import Counter
from collections import OrderedDict
from collections import defaultdict
from collections import namedtuple
from typing import Any

import pytest

from rollmesh.verifier.errors import BadValue
from rollmesh.verifier.errors import ChannelBroken
from rollmesh.verifier.sandbox._clean_runner import _instrument
from rollmesh.verifier.sandbox._clean_runner import _names_of
from rollmesh.verifier.sandbox._clean_runner import _pytest_style
from rollmesh.verifier.sandbox._sandbox_runner import decode_loose
from rollmesh.verifier.sandbox._sandbox_runner import encode
from rollmesh.verifier.sandbox.checks import names_used
from rollmesh.verifier.sandbox.checks import plain_names
from rollmesh.verifier.sandbox.checks import replain
from rollmesh.verifier.sandbox.checks import unverifiable_case
from rollmesh.verifier.sandbox.values import Ref
from rollmesh.verifier.sandbox.values import Shaped
from rollmesh.verifier.sandbox.values import decode_value
from rollmesh.verifier.sandbox.values import parse_frame


@pytest.mark.parametrize(
    "wire",
    [
        ["weird", 1],
        ["list", "notalist"],
        ["int", "zz"],
        ["float", "1.5"],
        ["dict", [[["list", []], 1]]],  # unhashable key
        ["set", [["list", []]]],
        {"a": 1},
        ["list", [1, 2], 3],
    ],
)
def test_decoder_rejects_anything_but_plain_values(wire: Any) -> None:
    with pytest.raises(BadValue):
        decode_value(wire)


def test_codec_round_trips_plain_values() -> None:
    value = {
        "a": (1, 2.5, None, True),
        3: frozenset({b"x"}),
        (1, 2): [float("inf"), 2**200, -(2**70), 1 + 2j, bytearray(b"z"), "é"],
    }
    assert decode_value(encode(value)) == value
    decoded = decode_value(encode(value))
    assert type(decoded[(1, 2)][2]) is int and type(decoded["a"]) is tuple


def test_common_result_types_cross_with_their_type() -> None:
    """A namedtuple, range, Counter, OrderedDict, defaultdict, dict view or iterator the solution
    returns reaches the clean interpreter as that type (issue #38): `r.total`, `c.most_common()`,
    `d[missing]`, `keys == {...}` behave as in one interpreter. The verifier rebuilds no class and
    calls no factory: a namedtuple and a defaultdict cross it as a `Shaped`, written again as sent."""
    stats = namedtuple("Stats", "total count")
    grouped: defaultdict[int, list[str]] = defaultdict(list, {2: ["ab"]})
    value = [
        stats(6, 3),
        range(2, 9, 3),
        Counter("abca"),
        OrderedDict([("b", 2), ("a", 1)]),
        grouped,
        {"a": 1}.keys(),
        {"a": 1}.values(),
        {"a": 1}.items(),
        iter([1, 2]),
    ]
    wire = encode(value)
    assert [item[0] for item in wire[1]] == [
        "namedtuple", "range", "counter", "ordereddict", "defaultdict", "keys", "values", "items", "iterator"
    ]  # fmt: skip
    crossed = decode_loose(replain(wire))
    assert crossed[0] == (6, 3) and crossed[0].total == 6 and type(crossed[0]).__name__ == "Stats"
    assert crossed[1] == range(2, 9, 3) and crossed[2].most_common(1) == [("a", 2)]
    assert crossed[3] != OrderedDict([("a", 1), ("b", 2)]) and list(crossed[3]) == ["b", "a"]
    assert crossed[4][2] == ["ab"] and crossed[4][5] == [] and crossed[5] == {"a"}
    assert list(crossed[6]) == [1] and crossed[7] == {("a", 1)} and next(crossed[8]) == 1
    assert crossed[8] != [1, 2]  # an iterator is not a list, as in one interpreter
    verifier_side = decode_value(wire)
    assert isinstance(verifier_side[0], Shaped) and isinstance(verifier_side[4], Shaped)
    # a factory that is not a builtin type crosses as the object it is (a reference)
    assert replain(["defaultdict", [["ref", 1], []]]) == ["defaultdict", [["ref", 1], []]]


@pytest.mark.parametrize(
    "wire",
    [
        ["namedtuple", ["S; import os", ["a"], [1]]],
        ["namedtuple", ["class", ["a"], [1]]],
        ["namedtuple", ["S", ["a", "b"], [1]]],
        ["namedtuple", ["S", [3], [1]]],
        ["range", [1, 2]],
        ["range", [1, 2, 0]],
        ["range", [1.5, 2, 1]],
        ["defaultdict", [["builtin", "eval"], []]],
        ["defaultdict", [["ref", 1], []]],  # a reference only in an answer
        ["items", [1, 2]],
        ["keys", [["list", []]]],
        ["counter", [[["list", []], 1]]],
    ],
)
def test_result_types_decode_strictly(wire: Any) -> None:
    with pytest.raises(BadValue):
        decode_value(wire)


def test_reply_frames_are_strict() -> None:
    assert parse_frame(b'{"id": 3, "value": 1}') == {"id": 3, "value": 1}
    huge = b'{"id": 1, "value": ' + b"9" * 5000 + b"}"  # past int's digit limit: a ValueError escaped
    for bad in (b'{"id": "3"}', b'{"id": 1, "passed": 5}', b"[1]", b'{"id": 1, "value": NaN}', b"\xff", huge):
        with pytest.raises(BadValue):
            parse_frame(bad)


def test_exact_number_types_decode_strictly() -> None:
    """Fraction, Decimal and deque answers come back as the real types, bounded so that reducing
    or comparing them stays cheap; a malformed or oversized one is a BadValue (a failed case)."""
    from collections import deque
    from decimal import Decimal
    from fractions import Fraction

    for value in (Fraction(-1, 3), Decimal("0.30"), deque([1, Fraction(1, 2)]), 1 << 262_000):
        back = decode_value(json.loads(json.dumps(encode(value))))
        assert back == value and type(back) is type(value)
    for bad in (
        ["fraction", [1, 0]],
        ["fraction", [1.5, 2]],
        ["fraction", [["int", "f" * (1 << 15)], 3]],
        ["decimal", "1e999999999"],
        ["decimal", "1" * 5000],
        ["decimal", "nonsense"],
        ["int", "f" * ((1 << 16) + 1)],
    ):
        with pytest.raises(BadValue):
            decode_value(bad)


def test_references_cross_only_where_allowed() -> None:
    """An object of the solution's own comes back as a bare reference, only in a call's answer;
    a value is always written again by the verifier (a subclass or a NaN token never crosses)."""
    assert decode_value(["list", [["ref", 3], 1]], refs=True) == [Ref(3), 1]
    with pytest.raises(BadValue):
        decode_value(["ref", 3])
    for bad in (["ref", -1], ["ref", "3"], ["ref", 1 << 40]):
        with pytest.raises(BadValue):
            decode_value(bad, refs=True)
    assert replain(["dict", [["a", ["ref", 0]]]]) == ["dict", [["a", ["ref", 0]]]]
    assert replain(["float", "nan"]) == ["float", "nan"]
    # a key of the solution's own crosses as a reference too (it was an error of the verifier's)
    assert replain(["dict", [[["ref", 2], 1]]]) == ["dict", [[["ref", 2], 1]]]
    assert replain(["set", [["ref", 2], ["tuple", [["ref", 1]]]]])[0] == "set"


def test_names_of_the_solution_are_checked() -> None:
    names = [["add", "own", None], ["np", "module", "numpy"]]
    assert plain_names(names) == names
    # the clean interpreter's hooks (and every dunder) are never bound to the solution's claims
    assert plain_names([["__rm_pass__", "own", None], ["__builtins__", "own", None]]) == []
    for bad in (
        [["1x", "own", None]],
        [["class", "own", None]],
        [["x", "weird", None]],
        [["x", "module", 3]],
        [["drain", "imported", ["builtins", "eval"]]],  # a kind that chose an object here: gone
        "add",
        [["x"] * 4],
    ):
        with pytest.raises(ChannelBroken):
            plain_names(bad)


def test_only_names_the_tests_mention_are_bound() -> None:
    """A claim about a global the tests never mention imports and binds nothing in the clean
    interpreter."""
    assert names_used(["assert f(x) == math.pi", "assert (", "from solution import g\ng()"]) == {
        "f",
        "x",
        "math",
        "g",
    }


def test_a_case_tells_the_names_it_binds_from_those_it_uses() -> None:
    """What decides whether a global of the solution's named like a builtin is its own in a case
    (`CleanRunner._shadow`): the names the case uses that it does not bind itself."""
    tree = ast.parse(
        "n = 3\nimport math as m\nfor i in range(n):\n    assert pow(i, 2) == square(i)\n"
        "def f(x, *a, k=1):\n    return x\ntry:\n    pass\nexcept E as e:\n    pass\n"
    )
    mentioned, assigned = _names_of(tree)
    assert {"n", "i", "pow", "square", "range", "E"} <= mentioned
    assert assigned == {"n", "m", "i", "f", "x", "a", "k", "e"}


def test_only_a_test_that_does_not_parse_is_refused_before_running() -> None:
    assert unverifiable_case("assert add(1, 2) == 3 +")
    # whatever a case holds, the answer is a reason or None, never an exception of the verifier's
    bombs = {
        "nested brackets": "[" * 100_000,
        "unary minus chain": "-" * 1_000_000 + "1",
        "long sum": "1+" * 100_000 + "1",
        "attribute chain": "x" + ".y" * 200_000,
        "a lone surrogate": "assert f() == '\ud800'",
        "a NUL": "assert f()\x00",
    }
    for what, bomb in bombs.items():
        why = unverifiable_case(bomb)
        assert why and why.startswith("the test does not parse"), what
    for fine in (
        "i = 0\nwhile i < 2:\n    assert add(i, 0) == i\n    i += 1",
        "try:\n    assert f()\nexcept E:\n    pass",
    ):
        assert unverifiable_case(fine) is None


def test_asserts_are_counted_and_statement_calls_marked() -> None:
    """Every assert counts when it starts and when it passes (a failure the test catches still
    fails the case); a call made as a statement is marked, so what the solution changes in place
    comes back; a top-level import is forwarded to the solution's process."""
    src = "import math\nrev(xs)\ndef check(f):\n    import os\n    assert f(1) == 2, 'msg'\n"
    out = ast.unparse(_instrument(ast.parse(src)))
    assert "__rm_import__('import math')" in out and "__rm_import__('import os')" not in out
    assert "__rm_effect__(rev, xs)" in out
    assert "__rm_begin__()" in out and "assert __rm_pass__(f(1) == 2), 'msg'" in out


def test_pytest_style_functions_are_collected_unless_the_case_calls_them() -> None:
    src = (
        "def test_a():\n    pass\ndef test_b():\n    pass\ndef test_c(x):\n    pass\ntest_b()\n"
        "class TestX:\n    def test_m(self):\n        pass\n"
    )
    scope: dict[str, Any] = {}
    exec(src, scope)
    runs = _pytest_style(ast.parse(src), scope)
    assert [getattr(r, "__name__", "") for r in runs] == ["test_a", "test_m"]
