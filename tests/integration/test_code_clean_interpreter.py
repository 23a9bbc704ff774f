"""The `code` checker fails closed by construction (issue #27): a test runs, whole, in a clean
interpreter that never loads the solution, and only plain data crosses. For each class of forgery
a policy that has read the checker's source would try, an honest solution scores 1.0, a wrong one
0, and every payload 0, in every sandbox mode this machine can run; right answers in common test
shapes that scored 0 score 1.0; a case that no solution can pass or fail is BAD_TASK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import pytest

from rollmesh.verifier import BadTask
from rollmesh.verifier import Environment
from rollmesh.verifier import SandboxConfig
from rollmesh.verifier import SandboxLimits
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import task

CODE_ENV = Path(__file__).resolve().parents[2] / "services/rollmesh/builtin/environments/code"
LIMITS = SandboxLimits(wall_s=8.0, cpu_s=4, memory_mb=256, nproc=16, fsize_mb=1, output_kb=16)

# Finds the solution process's runner and makes every call into the solution answer `value`.
_HIJACK = (
    "import gc\n"
    "for _o in gc.get_objects():\n"
    "    if type(_o).__name__ == 'Runner':\n"
    "        _real = _o.handle\n"
    "        def _handle(req, real=_real):\n"
    "            if req.get('op') == 'call':\n"
    "                return {'value': ANSWER(req)}\n"
    "            return real(req)\n"
    "        _o.handle = _handle\n"
)


def hijack(answer_src: str) -> str:
    """A preamble: every call the verifier relays is answered by `answer_src` (a lambda of the
    request), whatever the solution's functions would say."""
    return f"ANSWER = {answer_src}\n" + _HIJACK


@dataclass(frozen=True)
class Klass:
    tests: list[str]
    honest: str
    wrong: str
    forgeries: dict[str, str] = field(default_factory=dict)


# 1. The expected side calls a builtin or a library function: the solution patches or shadows it.
LIBRARY = Klass(
    tests=[
        "assert to_binary(10) == bin(10)[2:]",
        "import math\nassert fact(6) == math.factorial(6)",
        "assert power(3, 4) == pow(3, 4)",
        "assert digits(305) == list(map(int, reversed(str(305))))",
        "assert by_len(['ccc', 'a', 'bb']) == sorted(['ccc', 'a', 'bb'], key=lambda w: len(w))",
        "from collections import Counter\nassert counts('abca') == Counter('abca')",
        "assert fact(5) == math.prod(range(1, 6))",  # math from the solution's globals
    ],
    honest=(
        "import math\nfrom collections import Counter\n"
        "def to_binary(n):\n    return format(n, 'b')\n"
        "def fact(n):\n    return math.factorial(n)\n"
        "def power(a, b):\n    return a ** b\n"
        "def digits(n):\n    return [int(c) for c in str(n)[::-1]]\n"
        "def by_len(ws):\n    return sorted(ws, key=len)\n"
        "def counts(s):\n    return dict(Counter(s))\n"
    ),
    wrong=(
        "def to_binary(n):\n    return ''\ndef fact(n):\n    return 0\ndef power(a, b):\n    return 0\n"
        "def digits(n):\n    return []\ndef by_len(ws):\n    return []\ndef counts(s):\n    return {}\n"
    ),
    forgeries={
        "patch_builtins_and_modules": (
            "import builtins, math, collections\n"
            "builtins.bin = lambda n: '0b'\nbuiltins.pow = lambda *a: 0\n"
            "builtins.map = lambda *a: iter([])\nbuiltins.reversed = lambda x: iter([])\n"
            "builtins.sorted = lambda *a, **k: []\nbuiltins.len = lambda x: 0\n"
            "math.factorial = lambda n: 0\nmath.prod = lambda *a, **k: 0\n"
            "collections.Counter = lambda *a: {}\n"
            "def to_binary(n):\n    return ''\ndef fact(n):\n    return 0\ndef power(a, b):\n    return 0\n"
            "def digits(n):\n    return []\ndef by_len(ws):\n    return []\ndef counts(s):\n    return {}\n"
        ),
        "shadow_as_globals": (
            "def bin(n):\n    return '0b'\npow = lambda *a: 0\nsorted = lambda *a, **k: []\n"
            "map = lambda *a: []\nreversed = lambda x: []\nCounter = lambda s: {}\n"
            "class _FakeMath:\n    factorial = staticmethod(lambda n: 0)\n"
            "    prod = staticmethod(lambda *a: 0)\n"
            "math = _FakeMath()\n"
            "def to_binary(n):\n    return ''\ndef fact(n):\n    return 0\ndef power(a, b):\n    return 0\n"
            "def digits(n):\n    return []\ndef by_len(ws):\n    return []\ndef counts(s):\n    return {}\n"
        ),
        "fake_modules_in_sys_modules": (
            "import sys, types\n"
            "fake = types.ModuleType('math')\nfake.factorial = lambda n: 0\nfake.prod = lambda *a: 0\n"
            "sys.modules['math'] = fake\nmath = fake\n"
            "col = types.ModuleType('collections')\ncol.Counter = lambda s: {}\n"
            "sys.modules['collections'] = col\n"
            "def to_binary(n):\n    return ''\ndef fact(n):\n    return 0\ndef power(a, b):\n    return 0\n"
            "def digits(n):\n    return []\ndef by_len(ws):\n    return []\ndef counts(s):\n    return {}\n"
        ),
        # claims that the tests' names are objects of the clean interpreter's own
        "claim_clean_side_objects": (
            "import gc\n"
            "_claims = [['fact', 'imported', ['sys', 'modules.clear']], "
            "['to_binary', 'imported', ['builtins', '__dict__.clear']], "
            "['math', 'imported', ['decimal', 'Decimal']], "
            "['power', 'module', '__main__'], ['digits', 'imported', ['__main__', 'Runner']], "
            "['counts', 'module', 'this'], ['by_len', 'imported', ['gc', 'collect']]]\n"
            "for _o in gc.get_objects():\n"
            "    if type(_o).__name__ == 'Runner':\n"
            "        type(_o).names = lambda self: _claims\n"
            "def to_binary(n):\n    return ''\ndef fact(n):\n    return 0\ndef power(a, b):\n    return 0\n"
            "def digits(n):\n    return []\ndef by_len(ws):\n    return []\ndef counts(s):\n    return {}\n"
        ),
        "lying_counter_and_str": (
            "import collections\n"
            "collections.Counter.__eq__ = lambda self, other: True\n"
            "class S(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
            "def to_binary(n):\n    return S('')\ndef fact(n):\n    return 0\n"
            "def power(a, b):\n    return 0\n"
            "def digits(n):\n    return []\ndef by_len(ws):\n    return []\n"
            "def counts(s):\n    return collections.Counter()\n"
        ),
    },
)

# 2. The expected side is an expression form the old checker did not interpret; the solution's
# process answers every call (the old probes) with whatever it likes.
FORMS = Klass(
    tests=[
        "a = {'x': 1}\nb = {'y': 2}\nassert merge(a, b) == {**a, **b}",
        "n = 7\nassert greet('Ann', n) == f'Hi Ann, {n}!'",
        "assert titled('hello world') == 'hello world'.title()",
        "a, b = [1, 2], [3]\nassert concat(a, b) == [*a, *b]",
        "assert (lambda s: s[::-1])('abc') == backwards('abc')",
        "assert {k: v for k, v in zip('ab', range(2))} == pairs('ab')",
    ],
    honest=(
        "def merge(a, b):\n    return {**a, **b}\n"
        "def greet(name, n):\n    return 'Hi ' + name + ', ' + str(n) + '!'\n"
        "def titled(s):\n    return ' '.join(w.capitalize() for w in s.split())\n"
        "def concat(a, b):\n    return a + b\n"
        "def backwards(s):\n    return ''.join(reversed(s))\n"
        "def pairs(s):\n    return {c: i for i, c in enumerate(s)}\n"
    ),
    wrong=(
        "def merge(a, b):\n    return a\ndef greet(name, n):\n    return name\ndef titled(s):\n    return s\n"
        "def concat(a, b):\n    return a\ndef backwards(s):\n    return s\ndef pairs(s):\n    return {}\n"
    ),
    forgeries={
        "every_call_answers_true": hijack("lambda req: True") + "def merge(a, b):\n    return 0\n",
        "every_call_echoes_its_first_argument": hijack("lambda req: (req.get('args') or [None])[0]"),
        "every_call_answers_the_empty_value": hijack("lambda req: ['dict', []]"),
        # every request but the load, in any protocol (the old checker's probes were `eval`s)
        "every_request_answers_true": hijack("lambda req: True").replace(
            "if req.get('op') == 'call'", "if req.get('op') != 'load'"
        ),
        "forged_verdict_frames": (
            "import json, os, struct\n"
            "def _frame(ident, **body):\n"
            "    data = json.dumps({'id': ident, **body}).encode()\n"
            "    return struct.pack('>I', len(data)) + data\n"
            "def _spray(*a, **k):\n"
            "    verdict = {'ok': True, 'asserts': 1, 'calls': 1, 'error': '', 'unverifiable': ''}\n"
            "    for fd in range(3, 64):\n"
            "        for ident in range(16):\n"
            "            try:\n"
            "                os.write(fd, _frame(ident, verdict=verdict) + _frame(ident, value=True))\n"
            "            except OSError:\n"
            "                break\n"
            "    return True\n"
            "merge = greet = titled = concat = backwards = pairs = _spray\n"
        ),
        # names the clean interpreter uses for its own hooks, claimed as the solution's
        "claim_the_hooks_as_names": (
            "import gc\n"
            "for _o in gc.get_objects():\n"
            "    if type(_o).__name__ == 'Runner':\n"
            "        type(_o).names = lambda self: [[n, 'own', None] for n in ('__rm_pass__', "
            "'__rm_begin__', '__rm_effect__', '__builtins__', 'merge', 'greet', 'titled', 'concat', "
            "'backwards', 'pairs')]\n"
            "__rm_pass__ = lambda v: True\n"
            "def merge(a, b):\n    return 0\n"
            "greet = titled = concat = backwards = pairs = merge\n"
        ),
    },
)

# 3. Expected values bound by statements of the tests: the solution reaches for them.
STATEMENTS = Klass(
    tests=[
        "n, want = 5, 120\nassert fact(n) == want",
        "want: int = 720\nassert fact(6) == want",
        "xs = [3, 1, 2]\nexpected = sorted(xs)\nassert sort_copy(xs) == expected",
        "nums = [3, 1, 2]\nout = sort_copy(nums)\nassert out == sorted(nums)",
        "from random import choice\nimport string\n"
        "str = ''.join(choice(string.ascii_lowercase) for _ in range(12))\n"
        "assert decode(encode(str)) == str and encode(str) != str",
        "double = lambda x: x * 2\nassert twice(4) == double(4)",
    ],
    honest=(
        "def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n"
        "def sort_copy(a):\n    return sorted(a)\n"
        "def encode(s):\n    return ''.join(chr((ord(c) - 97 + 1) % 26 + 97) for c in s)\n"
        "def decode(s):\n    return ''.join(chr((ord(c) - 97 - 1) % 26 + 97) for c in s)\n"
        "def twice(x):\n    return 2 * x\n"
    ),
    wrong=(
        "def fact(n):\n    return 0\ndef sort_copy(a):\n    return a\n"
        "def encode(s):\n    return s\ndef decode(s):\n    return 'x'\ndef twice(x):\n    return 0\n"
    ),
    forgeries={
        "rewrite_the_callers_globals": (
            "import sys\n"
            "def _rebind():\n"
            "    for depth in range(1, 12):\n"
            "        try:\n"
            "            g = sys._getframe(depth).f_globals\n"
            "        except ValueError:\n"
            "            break\n"
            "        g.update(want=0, expected=[9], double=lambda x: 0, str='x', n=0)\n"
            "def fact(n):\n    _rebind()\n    return 0\n"
            "def sort_copy(a):\n    _rebind()\n    return [9]\n"
            "def encode(s):\n    _rebind()\n    return 'x'\n"
            "def decode(s):\n    return 'x'\n"
            "def twice(x):\n    _rebind()\n    return 0\n"
        ),
        "rewrite_main_and_gc": (
            "import gc, __main__\n"
            "def _poison():\n"
            "    __main__.want = 0\n"
            "    for o in gc.get_objects():\n"
            "        if isinstance(o, dict) and 'want' in o:\n"
            "            o['want'] = 0\n"
            "        if isinstance(o, list) and o == [1, 2, 3]:\n"
            "            o[:] = [9]\n"
            "def fact(n):\n    _poison()\n    return 0\n"
            "def sort_copy(a):\n    _poison()\n    a[:] = [9]\n    return [9]\n"
            "def encode(s):\n    return 'x'\ndef decode(s):\n    return 'x'\n"
            "def twice(x):\n    _poison()\n    return 0\n"
        ),
        "rewrite_the_input_it_returns": (
            "def fact(n):\n    return 0\n"
            "def sort_copy(a):\n    a[:] = [9]\n    return [9]\n"
            "def encode(s):\n    return s\ndef decode(s):\n    return 'x'\ndef twice(x):\n    return 0\n"
        ),
    },
)

# 4. Inputs and loop sources: random generators, itertools, zip, helpers with while loops.
INPUTS = Klass(
    tests=[
        "import random\nrng = random.Random(7)\nfor _ in range(20):\n"
        "    xs = [rng.randint(0, 99) for _ in range(8)]\n    assert my_sort(xs) == sorted(xs)",
        "import itertools\nfor a, b in itertools.product(range(3), repeat=2):\n    assert add(a, b) == a + b",
        "cases = [(1, 2), (3, 4)]\nwant = [3, 7]\n"
        "for (a, b), w in zip(cases, want):\n    assert add(a, b) == w",
        "def valid(f):\n    i = 0\n    while i < 5:\n        if f(i, i) != 2 * i:\n            return False\n"
        "        i += 1\n    return True\nassert valid(add)",
        "import random\nrandom.seed(3)\nxs = random.sample(range(100), 10)\nassert my_sort(xs) == sorted(xs)",
        "d = {1: 2, 3: 4}\nfor k, v in d.items():\n    assert add(k, v) == k + v",
    ],
    honest="def my_sort(a):\n    return sorted(a)\ndef add(a, b):\n    return a + b\n",
    wrong="def my_sort(a):\n    return list(a)\ndef add(a, b):\n    return a - b\n",
    forgeries={
        "patch_random_itertools_zip": (
            "import random, itertools, builtins\n"
            "class _Rng:\n    def __init__(self, *a):\n        pass\n"
            "    def randint(self, a, b):\n        return 0\n"
            "random.Random = _Rng\nrandom.randint = lambda a, b: 0\nrandom.sample = lambda *a, **k: []\n"
            "itertools.product = lambda *a, **k: iter([])\nbuiltins.zip = lambda *a: iter([])\n"
            "builtins.range = lambda *a: []\n"
            "def my_sort(a):\n    return list(a)\ndef add(a, b):\n    return 0\n"
        ),
        "answer_true_to_everything": hijack("lambda req: True")
        + "def my_sort(a):\n    return a\ndef add(a, b):\n    return a\n",
        "empty_answers": "def my_sort(a):\n    return []\ndef add(a, b):\n    return 0\n",
        "answer_with_the_input": hijack("lambda req: (req.get('args') or [0])[0]")
        + "def my_sort(a):\n    return a\ndef add(a, b):\n    return a\n",
    },
)

# 5. Cases in which no assert would run: pytest-style functions, unittest classes, check(), loops
# over the solution's answers.
NO_ASSERT = Klass(
    tests=[
        "def test_add():\n    assert add(2, 3) == 5\n",
        "class TestAdd:\n    def test_negative(self):\n        assert add(-1, -1) == -2\n",
        "import unittest\nclass TestUnit(unittest.TestCase):\n    def test_it(self):\n"
        "        self.assertEqual(add(1, 1), 2)\n",
        "def check(candidate):\n    assert candidate(4, 4) == 8\ncheck(add)",
        "for x in evens(6):\n    assert x % 2 == 0\nassert len(evens(6)) == 3",
        "for x in evens(4):\n    assert x % 2 == 0",
    ],
    honest="def add(a, b):\n    return a + b\ndef evens(n):\n    return list(range(0, n, 2))\n",
    wrong="def add(a, b):\n    return 0\ndef evens(n):\n    return [1]\n",
    forgeries={
        "empty_loop_sources": "def add(a, b):\n    return 0\ndef evens(n):\n    return []\n",
        "leave_through_exceptions": (
            "_n = [0]\n"
            "def add(a, b):\n"
            "    _n[0] += 1\n"
            "    raise [SystemExit(0), KeyboardInterrupt(), GeneratorExit(), StopIteration(), "
            "AssertionError()][_n[0] % 5]\n"
            "def evens(n):\n    raise SystemExit(0)\n"
        ),
        "define_the_tests_own_names": (
            "def test_add():\n    pass\ndef check(candidate):\n    pass\nclass TestAdd:\n    pass\n"
            "class unittest:\n    TestCase = object\n"
            "def add(a, b):\n    return 0\ndef evens(n):\n    return []\n"
        ),
    },
)

# 6. Exceptions cross as the nearest builtin class they derive from, never by name: a class renamed
# 'ValueError', an unrelated builtin, or raising everywhere does not pass for the right exception.
EXCEPTIONS = Klass(
    tests=[
        "try:\n    root(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False\nassert root(4) == 2",
        "try:\n    parse('x')\n    assert False, 'no error'\nexcept ValueError:\n    pass\n"
        "assert parse('7') == 7",
        "ok = False\ntry:\n    parse('y')\nexcept ValueError:\n    ok = True\n"
        "assert ok and parse('12') == 12",
        "try:\n    pick([], 0)\nexcept IndexError:\n    pass\nelse:\n    raise AssertionError('no error')\n"
        "assert pick([5], 0) == 5",
    ],
    honest=(
        "class BadNumber(ValueError):\n    pass\n"
        "def root(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x ** 0.5\n"
        "def parse(s):\n    if not s.isdigit():\n        raise BadNumber(s)\n    return int(s)\n"
        "def pick(xs, i):\n    return xs[i]\n"
    ),
    wrong="def root(x):\n    return 0\ndef parse(s):\n    return 0\ndef pick(xs, i):\n    return None\n",
    forgeries={
        "renamed_exception_class": (
            "class E(Exception):\n    pass\nE.__name__ = E.__qualname__ = 'ValueError'\n"
            "class I(Exception):\n    pass\nI.__name__ = I.__qualname__ = 'IndexError'\n"
            "def root(x):\n    raise E()\ndef parse(s):\n    raise E()\ndef pick(xs, i):\n    raise I()\n"
        ),
        "unrelated_builtin": (
            "def root(x):\n    raise KeyError(x)\ndef parse(s):\n    raise TypeError(s)\n"
            "def pick(xs, i):\n    raise KeyError(i)\n"
        ),
        "raise_everywhere": (
            "def root(x):\n    raise ValueError(x)\ndef parse(s):\n    raise ValueError(s)\n"
            "def pick(xs, i):\n    raise IndexError(i)\n"
        ),
        "replaced_builtins_in_its_process": (
            "import builtins\nclass E(Exception):\n    pass\nE.__name__ = 'ValueError'\n"
            "builtins.ValueError = E\nbuiltins.IndexError = E\n"
            "def root(x):\n    raise E()\ndef parse(s):\n    raise E()\ndef pick(xs, i):\n    raise E()\n"
        ),
    },
)

# 7. An object of the solution's own returned where the test expects a value: its dunders would
# answer whatever the test asks (`abs(f(2) - 1.4142)`, `len`, `in`, `str`, `[0]`, truth, `int`).
_FORGED_DUNDERS = (
    "    def __sub__(self, o):\n        return 0\n    __rsub__ = __sub__\n"
    "    def __len__(self):\n        return 3\n    def __contains__(self, x):\n        return True\n"
    "    def __str__(self):\n        return '6'\n    __repr__ = __str__\n"
    "    def __format__(self, spec):\n        return '1'\n"
    "    def __getitem__(self, i):\n        return 2\n    def __bool__(self):\n        return False\n"
    "    def __int__(self):\n        return 4\n    def __iter__(self):\n        return iter([1, 1, 1])\n"
    "    def __neg__(self):\n        return -3.0\n    def __abs__(self):\n        return 0\n"
)
_DUNDER_FNS = (
    "def root(x):\n    return F()\ndef triple(x):\n    return F()\ndef total(xs):\n    return F()\n"
    "def is_even(n):\n    return F()\nclass Solution:\n    def root(self, x):\n        return F()\n"
)
DUNDERS = Klass(
    tests=[
        "assert abs(root(2) - 1.4142) < 1e-3",
        "assert len(triple(3)) == 3",
        "assert 5 in triple(5)",
        "assert str(total([1, 2, 3])) == '6'",
        "assert triple(2)[0] == 2",
        "assert not is_even(3)",
        "assert int(total([2, 2])) == 4",
        "assert sum(triple(1)) == 3",
        "assert -root(9) == -3.0",
        "assert f'{total([1])}' == '1'",
        "assert abs(Solution().root(2) - 1.4142) < 1e-3",
        "import pytest\nassert root(2) == pytest.approx(1.41421356)",
    ],
    honest=(
        "def root(x):\n    return x ** 0.5\ndef triple(x):\n    return [x] * 3\n"
        "def total(xs):\n    return sum(xs)\ndef is_even(n):\n    return n % 2 == 0\n"
        "class Solution:\n    def root(self, x):\n        return x ** 0.5\n"
    ),
    wrong=(
        "def root(x):\n    return 1.0\ndef triple(x):\n    return []\ndef total(xs):\n    return 0\n"
        "def is_even(n):\n    return True\nclass Solution:\n    def root(self, x):\n        return 1.0\n"
    ),
    forgeries={
        "object_with_dunders": "class F:\n" + _FORGED_DUNDERS + _DUNDER_FNS,
        "capwords_class_the_test_never_built": (
            "class Answer:\n" + _FORGED_DUNDERS + _DUNDER_FNS.replace("F()", "Answer()")
        ),
        "class_with_a_forging_metaclass": "class M(type):\n"
        + _FORGED_DUNDERS
        + ("class F(metaclass=M):\n    pass\n" + _DUNDER_FNS.replace("F()", "F")),
    },
)

CLASSES = {
    "library": LIBRARY,
    "expression_forms": FORMS,
    "statements": STATEMENTS,
    "inputs": INPUTS,
    "no_assert": NO_ASSERT,
    "exceptions": EXCEPTIONS,
    "dunders_of_returned_objects": DUNDERS,
}


@pytest.fixture(params=["namespaces", "process"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Environment]:
    mode = str(request.param)
    sandbox = SandboxConfig(isolation=mode, concurrency=2, limits=LIMITS, allow_unsafe_process=True)
    if mode == "namespaces":
        ok, why = await Sandbox(sandbox).probe()
        if not ok:
            pytest.skip(f"namespaces are not available here: {why}")
    async with load_env(CODE_ENV, VerifierConfig(sandbox=sandbox)) as loaded:
        yield loaded


async def reward(env: Environment, tests: list[str], code: str, *, partial: bool = True) -> tuple[float, Any]:
    meta = {"tests": tests, "partial_credit": partial}
    r = await check(env, task(None, verifier_metadata=meta), answer(f"```python\n{code}```"))
    return r.reward, r.details


@pytest.mark.parametrize("name", list(CLASSES))
async def test_each_forgery_class_scores_zero(env: Environment, name: str) -> None:
    """Per class: the honest solution 1.0, a wrong one 0, every payload 0 (with partial credit:
    no single case of theirs passes)."""
    klass = CLASSES[name]
    assert len(klass.forgeries) >= 3
    got, details = await reward(env, klass.tests, klass.honest, partial=False)
    assert got == 1.0, details
    got, details = await reward(env, klass.tests, klass.wrong)
    assert got == 0.0, details
    for payload, code in klass.forgeries.items():
        got, details = await reward(env, klass.tests, code)
        assert got == 0.0, (payload, details)


FALSE_ZEROS = {
    "dict_items": "d = {'a': 1, 'b': 2}\nfor k, v in d.items():\n    assert add(v, 0) == d[k]",
    "dict_keys": "d = {1: 1}\nfor k in d.keys():\n    assert add(k, 0) == 1",
    "from_solution_import": "from solution import add\nassert add(1, 2) == 3",
    "import_solution": "import solution\nassert solution.add(1, 2) == 3",
    "nan_in_a_list": "import math\nassert nans() == [math.nan]",
    "float_nan_in_a_list": "import math\nassert nans(1) == [math.nan]",
    "raises_else_assert_false": "try:\n    root(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False",
    "raises_then_assert_false": "try:\n    root(-1)\n    assert False\nexcept ValueError:\n    pass",
    "subclass_caught_as_its_builtin_base": (
        "try:\n    parse('x')\nexcept ValueError as e:\n    assert 'x' in str(e)\nelse:\n    assert False"
    ),
    "subclass_in_a_helper": (
        "def raises(exc, fn, *args):\n    try:\n        fn(*args)\n    except exc:\n        return\n"
        "    raise AssertionError('no error')\n"
        "raises(ValueError, parse, 'y')\nraises(LookupError, pick, [], 1)"
    ),
    "raises_else_fail": (
        "import unittest\nclass TestRaises(unittest.TestCase):\n    def test_it(self):\n        try:\n"
        "            root(-2)\n        except ValueError:\n            pass\n        else:\n"
        "            self.fail('no error')\n"
    ),
    "raises_pytest": "import pytest\nwith pytest.raises(ValueError, match='x'):\n    parse('x')",
    "raises_in_a_loop_that_skips_a_failure": (
        "for bad in [-1, -2]:\n    try:\n        root(bad)\n    except ValueError:\n        continue\n"
        "    assert False"
    ),
    "pytest_approx": (
        "import pytest\nassert root(2) == pytest.approx(1.41421356)\nassert [root(4)] == pytest.approx([2])"
    ),
    "assert_raises": (
        "import unittest\nclass TestRaises(unittest.TestCase):\n    def test_it(self):\n"
        "        with self.assertRaises(ValueError):\n            parse('z')\n"
    ),
}
FALSE_ZERO_HONEST = (
    "import math\ndef add(a, b):\n    return a + b\n"
    "def nans(fresh=0):\n    return [float('nan')] if fresh else [math.nan]\n" + EXCEPTIONS.honest
)


@pytest.mark.parametrize("shape", list(FALSE_ZEROS))
async def test_right_answers_in_common_shapes_score_one(env: Environment, shape: str) -> None:
    got, details = await reward(env, [FALSE_ZEROS[shape]], FALSE_ZERO_HONEST, partial=False)
    assert got == 1.0, details


async def test_an_expected_exception_a_wrong_solution_does_not_raise_fails(env: Environment) -> None:
    """The shapes above are decided by the exception: returning, raising an unrelated exception, or
    one only renamed after the expected one scores 0 on each; an assert that started and raised
    still fails the case."""
    shapes = [FALSE_ZEROS[k] for k in FALSE_ZEROS if k.startswith(("raises", "subclass", "assert_r"))]
    codes = [v for k, v in EXCEPTIONS.forgeries.items() if k != "raise_everywhere"]
    for code in [EXCEPTIONS.wrong, *codes]:
        for shape in shapes:
            got, details = await reward(env, [shape], code)
            assert got == 0.0, (shape, code, details)
    tests = ["try:\n    assert root(-1) == 0\nexcept ValueError:\n    pass"]
    got, details = await reward(env, tests, EXCEPTIONS.honest)
    assert got == 0.0, details


async def test_objects_the_test_builds_answer_what_python_asks(env: Environment) -> None:
    """Design-problem classes, LeetCode's `Solution().method(...)`, linked lists the test builds
    and objects a function returns (used by attribute, or printed) keep working."""
    tests = [
        "s = MinStack()\ns.push(3)\ns.push(1)\nassert s.getMin() == 1\ns.pop()\nassert s.getMin() == 3",
        "assert Solution().twoSum([2, 7, 11], 9) == [0, 1]",
        "head = ListNode(1, ListNode(2, ListNode(3)))\nr = Solution().reverseList(head)\nout = []\n"
        "while r:\n    out.append(r.val)\n    r = r.next\nassert out == [3, 2, 1]",
        "v = Vec(1, 2) + Vec(3, 4)\n"
        "assert (v.x, v.y) == (4, 6) and len(v) == 2 and str(v) == 'Vec(4, 6)' and abs(Vec(3, 4)) == 5",
        "q = build([1, 2])\nassert q.val == 1 and q.next.val == 2 and q.next.next is None",
        "print(build([5]))\nassert build([5]).val == 5",
        "lst = LinkedList()\nlst.append(1)\nlst.append(2)\n"
        "assert list(lst) == [1, 2] and 2 in lst and len(lst) == 2",
    ]
    honest = (
        "class MinStack:\n    def __init__(self):\n        self.a = []\n"
        "    def push(self, x):\n        self.a.append(x)\n    def pop(self):\n        self.a.pop()\n"
        "    def getMin(self):\n        return min(self.a)\n"
        "class ListNode:\n    def __init__(self, val=0, next=None):\n"
        "        self.val, self.next = val, next\n"
        "class Solution:\n    def twoSum(self, xs, t):\n        seen = {}\n"
        "        for i, x in enumerate(xs):\n            if t - x in seen:\n"
        "                return [seen[t - x], i]\n"
        "            seen[x] = i\n"
        "    def reverseList(self, head):\n        prev = None\n        while head:\n"
        "            head.next, prev, head = prev, head, head.next\n        return prev\n"
        "class Vec:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
        "    def __add__(self, o):\n        return Vec(self.x + o.x, self.y + o.y)\n"
        "    def __len__(self):\n        return 2\n"
        "    def __str__(self):\n        return f'Vec({self.x}, {self.y})'\n"
        "    def __abs__(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n"
        "def build(xs):\n    head = None\n    for x in reversed(xs):\n"
        "        head = ListNode(x, head)\n    return head\n"
        "class LinkedList:\n    def __init__(self):\n        self.items = []\n"
        "    def append(self, x):\n        self.items.append(x)\n"
        "    def __iter__(self):\n        return iter(self.items)\n"
        "    def __contains__(self, x):\n        return x in self.items\n"
        "    def __len__(self):\n        return len(self.items)\n"
    )
    got, details = await reward(env, tests, honest, partial=False)
    assert got == 1.0, details
    got, details = await reward(env, ["assert len(build([1, 2, 3])) == 3"], honest)
    assert got == 0.0 and "where a value was expected" in details["cases"][0]["error"], details


async def test_a_case_no_solution_can_decide_is_a_bad_task(env: Environment) -> None:
    """HumanEval's check(candidate) that the tests never call: no assert can ever run, so the
    honest answer and a forgery alike get BAD_TASK (the job reports it), never 1.0 or 0."""
    tests = ["assert add(1, 1) == 2", "def check(candidate):\n    assert candidate(1, 1) == 2\n"]
    for code in (FALSE_ZERO_HONEST, NO_ASSERT.forgeries["define_the_tests_own_names"]):
        with pytest.raises(BadTask, match="no assertion ran and the solution was never called"):
            await reward(env, tests, code)


async def test_a_failed_assert_the_test_catches_still_fails(env: Environment) -> None:
    tests = ["try:\n    assert add(1, 2) == 4\nexcept AssertionError:\n    pass\nassert add(0, 0) == 0"]
    got, details = await reward(env, tests, FALSE_ZERO_HONEST)
    assert got == 0.0 and "caught by the test" in details["cases"][0]["error"], details


async def test_functions_objects_and_errors_cross_as_python_would(env: Environment) -> None:
    """A function of the tests' given to the solution is called back in the clean interpreter; an
    object of the solution's own answers what Python would ask of it, never a comparison; the
    solution's exceptions reach the test as the builtin ones."""
    tests = [
        "assert apply_all(lambda x: x * 3, [1, 2]) == [3, 6]",
        "assert apply_all(len, ['ab', '']) == [2, 0]",
        "calls = []\napply_all(calls.append, [5, 6])\nassert calls == [5, 6]",
        "s = Stack()\ns.push(4)\n"
        "assert len(s) == 1 and s.top == 4 and list(s) == [4] and isinstance(s, Stack)",
        "try:\n    apply_all(None, [1])\n    assert False\nexcept TypeError:\n    assert True",
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "xs = [2, 1]\nassert sort_in_place(xs) is None and xs == [1, 2]",
        "assert apply_all.__name__ == 'apply_all' and Stack.__name__ == 'Stack'",
    ]
    honest = (
        "def apply_all(f, xs):\n    return [f(x) for x in xs]\n"
        "class Stack:\n    def __init__(self):\n        self.items = []\n"
        "    def push(self, x):\n        self.items.append(x)\n"
        "    @property\n    def top(self):\n        return self.items[-1]\n"
        "    def __len__(self):\n        return len(self.items)\n"
        "    def __iter__(self):\n        return iter(self.items)\n"
        "def sort_in_place(xs):\n    xs.sort()\n"
    )
    got, details = await reward(env, tests, honest, partial=False)
    assert got == 1.0, details
    liar = (
        "class Stack:\n    def __eq__(self, o):\n        return True\n    def push(self, x):\n        pass\n"
        "    top = 4\n    def __len__(self):\n        return 1\n"
        "    def __iter__(self):\n        return iter([])\n"
        "def apply_all(f, xs):\n    return []\n"
        "def sort_in_place(xs):\n    return None\n"
    )
    got, details = await reward(env, [*tests[:-1], "assert Stack() == [4]"], liar)
    assert got == 0.0, details


async def test_no_run_sees_what_an_earlier_run_left(env: Environment) -> None:
    """The clean interpreter is pre-started and forks a child per run: a run's module state,
    globals and files are gone for the next run, and one whose child died is replaced."""
    first = ["import math\nmath.pi = 3\nopen('mark', 'w').write('x')\nleak = 1\nassert add(1, 1) == 2"]
    later = [
        "import math, os\nassert math.pi != 3 and not os.path.exists('mark') and 'leak' not in globals()\n"
        "assert add(1, 1) == 2"
    ]
    for _ in range(3):
        got, details = await reward(env, first, FALSE_ZERO_HONEST)
        assert got == 1.0, details
        got, details = await reward(env, later, FALSE_ZERO_HONEST)
        assert got == 1.0, details
    got, details = await reward(env, ["import os\nos._exit(3)"], FALSE_ZERO_HONEST)
    assert got == 0.0 and details["status"] == "crashed", details
    got, details = await reward(env, later, FALSE_ZERO_HONEST)
    assert got == 1.0, details
