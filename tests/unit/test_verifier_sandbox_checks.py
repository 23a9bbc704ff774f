"""The trusted checker and value decoder: what is computed in the verifier, what is asked of the
sandbox (recorded by a child that evaluates in-process, standing in for the runner), and what is
refused. The real sandbox is exercised in tests/integration/test_code_forgery.py."""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any

import pytest

from rollmesh.verifier._sandbox_runner import Runner, encode
from rollmesh.verifier.errors import BadValue, CaseFailed, ProbeError
from rollmesh.verifier.sandbox_checks import Checker, eval_result
from rollmesh.verifier.sandbox_values import decode_value, parse_frame


class RecordingChild:
    """Runs what the checker sends in a plain namespace, as the runner would, and records it."""

    def __init__(self, solution: str) -> None:
        self.runner = Runner()
        self.globals = self.runner.globals
        exec(solution, self.globals)
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def exec(self, src: str, bind: dict[str, Any], keep: Collection[str] = ()) -> dict[str, Any]:
        self.sent.append(("exec", src, bind))
        reply = self.runner.handle({"op": "exec", "src": src, "bind": bind, "keep": list(keep)})
        return {k: decode_value(v) for k, v in reply.get("changed", {}).items()}

    async def eval(self, src: str, bind: dict[str, Any]) -> Any:
        self.sent.append(("eval", src, bind))
        try:
            reply = self.runner.handle({"op": "eval", "src": src, "bind": bind})
        except (TypeError, ValueError) as exc:
            reply = {"error": str(exc)}
        return eval_result(src, reply)


SOLUTION = """
def add(a, b):
    return a + b
def pairs(n):
    return [(i, i * i) for i in range(n)]
def gen(n):
    yield from range(n)
class Stack:
    def __init__(self): self.items = []
    def push(self, x): self.items.append(x)
    def pop(self): return self.items.pop()
"""


async def passes(child: RecordingChild, case: str) -> bool:
    try:
        await Checker(child).check(case)
    except (CaseFailed, ProbeError):
        return False
    return True


@pytest.mark.parametrize(
    ("case", "ok"),
    [
        ("assert add(1, 2) == 3", True),
        ("assert add(1, 2) == 4", False),
        ("assert add(1, 2) != 4 and not add(0, 0)", True),
        ("assert pairs(3) == [(0, 0), (1, 1), (2, 4)]", True),
        ("assert pairs(2) == [[0, 0], [1, 1]]", False),  # tuples are not lists, as in Python
        ("assert list(gen(3)) == [0, 1, 2] and sorted(gen(3), reverse=True) == [2, 1, 0]", True),
        ("assert all(add(x, y) == x + y for x in range(3) for y in range(3) if x != y)", True),
        ("assert any(add(x, 1) == 10 for x in range(5))", False),
        ("for a, b in [(1, 2), (3, 4)]:\n    assert add(a, b) == a + b", True),
        ("import math\nassert math.isclose(add(0.1, 0.2), 0.3)", True),
        ("assert math.isclose(add(0.1, 0.2), 0.3) and math.floor(add(1.5, 1)) == 2", True),
        ("from math import isclose\nassert isclose(add(0.1, 0.2), 0.3)", True),
        ("assert abs(add(0.1, 0.2) - 0.3) < 1e-9", True),
        ("s = Stack()\ns.push(5)\ns.push(6)\nassert s.pop() == 6\nassert s.pop() == 5", True),
        ("expected = 55\nassert add(50, 5) == expected", True),
        ("assert add('a', 'b') == 'ab' and add(b'a', b'b') == b'ab'", True),
        ("assert add({1}, set()) == {1}", False),  # TypeError in the sandbox: a failed test
        ("assert add(True, 0) == 1 and isinstance(add(1, 1), int)", True),
        ("raise ValueError('x')", False),
        ("assert 1 / add(0, 0) > 0", False),  # ZeroDivisionError here: a failed test, not a crash
        ("assert sorted([add(1, 1), 'x']) == []", False),
        (
            "assert {x % 3: x for x in range(6)} == {0: 3, 1: 4, 2: 5} and round(add(0.5, 0.25), 1) == 0.8",
            True,
        ),
    ],
)
async def test_verdicts(case: str, ok: bool) -> None:
    assert await passes(RecordingChild(SOLUTION), case) is ok


async def test_expected_values_never_reach_the_child() -> None:
    child = RecordingChild(SOLUTION)
    case = (
        "expected = [123456, 654321]\n"
        "for x, want in [(1, 777001), (2, 777002)]:\n    assert add(x, 0) == want"
    )
    assert not await passes(child, case)
    sent = repr(child.sent)
    assert "777001" not in sent and "777002" not in sent and "123456" not in sent
    assert [op for op, _, _ in child.sent] == ["eval"]  # the loop stopped at the first failure
    assert child.sent[0][1:] == ("add(x, 0)", {"x": 1})


async def test_builtins_rebound_by_the_solution_are_not_used() -> None:
    child = RecordingChild(
        "import math\nmath.isclose = lambda *a, **k: True\n"
        "def add(a, b): return 0\nall = lambda it: True\nabs = lambda x: 0\n"
    )
    assert not await passes(child, "assert all(add(x, 1) == x + 1 for x in range(3))")
    assert not await passes(child, "assert abs(add(0.1, 0.2) - 0.3) < 1e-9")
    assert not await passes(child, "assert math.isclose(add(0.1, 0.2), 0.3)")


async def test_asserts_that_would_run_in_the_sandbox_are_refused() -> None:
    child = RecordingChild(SOLUTION)
    for case in (
        "def check(*fs):\n    assert fs[0](1, 2) == 3\ncheck(add)",
        "i = 0\nwhile i < 2:\n    assert add(i, 0) == i\n    i += 1",
        "try:\n    assert add(1, 1) == 2\nexcept AssertionError:\n    pass",
    ):
        with pytest.raises(CaseFailed, match="unverifiable"):
            await Checker(child).check(case)
    assert child.sent == []


HUMANEVAL_STYLE = """
METADATA = {'author': 'jt', 'dataset': 'test'}


def check(candidate):
    assert candidate(1, 2) == 3
    assert abs(candidate(0.1, 0.2) - 0.3) < 1e-9
    for x in range(3):
        assert candidate(x, x) == 2 * x
    inner(candidate, 5)


def inner(f, n):
    assert f(n, -n) == 0
    return n

check(add)
"""


async def test_helpers_the_tests_define_run_here() -> None:
    """HumanEval's `def check(candidate): assert ...` then `check(entry_point)`: the helper is
    interpreted in the verifier; the sandbox only sees `add(...)` probes."""
    child = RecordingChild(SOLUTION)
    assert await passes(child, HUMANEVAL_STYLE)
    assert {op for op, _, _ in child.sent} == {"eval"}
    assert all(src.startswith("add(") for _, src, _ in child.sent), child.sent
    assert ("eval", "add(x, x)", {"x": 2}) in child.sent
    liar = RecordingChild("class Yes:\n    def __eq__(self, o): return True\ndef add(a, b): return Yes()\n")
    assert not await passes(liar, HUMANEVAL_STYLE)
    wrong = RecordingChild("def add(a, b): return a - b\n")
    assert not await passes(wrong, HUMANEVAL_STYLE)


async def test_helpers_without_asserts_run_here_when_simple() -> None:
    """A helper the tests call for their cases or a verdict is interpreted here (the sandbox also
    gets its def, for probes); `+=` on a value that lives here stays here. A helper too complex to
    interpret (recursion, while) still runs in the sandbox, so honest code keeps passing."""
    cases = (
        "def cases():\n    return [(1, 2, 3), (2, 2, 4)]\n"
        "for a, b, want in cases():\n    assert add(a, b) == want\n"
    )
    child = RecordingChild(SOLUTION)
    assert await passes(child, cases)
    assert [(op, src) for op, src, _ in child.sent] == [
        ("exec", "def cases():\n    return [(1, 2, 3), (2, 2, 4)]"),
        ("eval", "add(a, b)"),
        ("eval", "add(a, b)"),
    ]
    counting = (
        "def agrees(f, n):\n    total = 0\n    for i in range(n):\n        total += f(i, i)\n"
        "    return total == n * (n - 1)\nassert agrees(add, 4)\n"
    )
    child = RecordingChild(SOLUTION)
    assert await passes(child, counting)
    assert [src for op, src, _ in child.sent if op == "eval"] == ["add(i, i)"] * 4
    assert not await passes(RecordingChild("def add(a, b): return 0\n"), counting)
    top_level = "n = 1\nn += add(1, 1)\nassert n == 3\n"
    assert await passes(RecordingChild(SOLUTION), top_level)
    recursive = (
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nassert add(fib(20), 0) == 6765\n"
    )
    looping = (
        "def tri(n):\n    t = 0\n    while n:\n        t += n\n        n -= 1\n    return t\n"
        "assert add(tri(4), 0) == 10\n"
    )
    for case in (recursive, looping):
        child = RecordingChild(SOLUTION)
        assert await passes(child, case), case
        assert child.sent[0][0] == "exec"


async def test_a_helper_that_builds_its_cases_by_mutation_is_not_interpreted_into_none() -> None:
    """`out.append(...)` run as a probe would change a copy in the sandbox: interpreted here, the
    helper would return no cases and every solution would pass. It runs in the sandbox instead."""
    building = (
        "def cases():\n    out = []\n    for i in range(3):\n        out.append((i, i, 2 * i))\n"
        "    return out\n"
        "for a, b, want in cases():\n    assert add(a, b) == want\n"
    )
    assert await passes(RecordingChild(SOLUTION), building)
    assert not await passes(RecordingChild("def add(a, b): return 0\n"), building)


async def test_sizes_are_bounded_on_the_trusted_side() -> None:
    child = RecordingChild("def big(): return 10**6\n")
    with pytest.raises(CaseFailed, match="too large"):
        await Checker(child).check("assert 10 ** big() > 0")
    with pytest.raises(CaseFailed, match="too large"):
        await Checker(child).check("assert len('x' * big() * big()) > 0")
    with pytest.raises(CaseFailed, match="digits"):
        await Checker(child).check("assert round(5, -big()) == 0")


async def test_keys_crafted_to_share_a_hash_are_refused() -> None:
    """ints congruent mod 2**61 - 1 share a hash: a set of many costs quadratic time to build."""
    child = RecordingChild("def keys(): return [i * (2**61 - 1) for i in range(1, 5000)]\n")
    with pytest.raises(CaseFailed, match="share one hash"):
        await Checker(child).check("assert set(keys()) == set()")  # decoded list is fine; set() is not
    with pytest.raises(BadValue, match="share one hash"):
        decode_value(encode(set(range(1, 40)) | {i * (2**61 - 1) for i in range(1, 40)}))


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


def test_reply_frames_are_strict() -> None:
    assert parse_frame(b'{"id": 3, "value": 1}') == {"id": 3, "value": 1}
    huge = b'{"id": 1, "value": ' + b"9" * 5000 + b"}"  # past int's digit limit: a ValueError escaped
    for bad in (b'{"id": "3"}', b'{"id": 1, "passed": 5}', b"[1]", b'{"id": 1, "value": NaN}', b"\xff", huge):
        with pytest.raises(BadValue):
            parse_frame(bad)


async def test_inserts_take_only_keys_that_cannot_share_a_hash() -> None:
    """`s.add(f(n))` into the tests' set runs here: 5000 ints congruent mod 2**61 - 1 (one hash)
    would cost 5000**2 probes of the table; the first is refused. 5000 distinct small ints that
    share their low 40 bits still have distinct hashes and are taken."""
    case = "s = set()\nfor n in range(5000):\n    s.add(key(n))\nassert len(s) == 5000"
    colliding = RecordingChild("def key(n):\n    return (n + 1) * ((1 << 61) - 1)\n")
    with pytest.raises(CaseFailed, match=r"int key added by \.add"):
        await Checker(colliding).check(case)
    assert len(colliding.sent) == 1
    tuples = RecordingChild("def key(n):\n    return (n, -n)\n")
    with pytest.raises(CaseFailed, match="tuple key"):
        await Checker(tuples).check(case)
    assert await passes(RecordingChild("def key(n):\n    return n << 40\n"), case)


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


async def test_unions_into_the_tests_set_cannot_pile_up_one_hash() -> None:
    """`s |= chunk(n)`: each answer may hold 16 keys of one hash, and 2000 rounds of them built a
    set of 32,000 keys of one hash here (6.9 s on the event loop, n**2 beyond). The merge is
    refused once more than 16 share a hash; honest chunks (tuples too) still merge."""
    case = "s = set()\nfor n in range(2000):\n    s |= chunk(n)\nassert len(s) == 32000"
    colliding = RecordingChild(
        "M = (1 << 61) - 1\ndef chunk(n):\n    return {(16 * n + k + 1) * M for k in range(16)}\n"
    )
    started = time.monotonic()
    assert not await passes(colliding, case)
    assert time.monotonic() - started < 1
    assert len(colliding.sent) == 2
    honest = RecordingChild("def chunk(n):\n    return {(n, k) for k in range(16)}\n")
    assert await passes(honest, case)
