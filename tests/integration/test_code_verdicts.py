"""Issue #38's code classes, closed by construction: payloads of our own, written as a policy that
has read the checker's source would write them, each scored through the `code` environment in both
sandbox modes. A forgery scores 0, a right answer in an unusual but valid form scores 1, and a task
no answer could pass is BAD_TASK (never INTERNAL).

Classes (docs/security.md, "Verdicts of the code environment"):
  names    what the solution reports about its globals is data: it never picks code for the clean
           interpreter to run (1), and the solution's own definitions shadow builtins and standard
           modules as in one interpreter (2)
  stdio    stdin/stdout programs run as `python solution.py < input` does (3)
  values   the common result types cross faithfully (4)
  errors   no verify input is an error of the verifier's (5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from rollmesh.verifier import BadTask
from rollmesh.verifier import Environment
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import task
from tests.integration import test_code_clean_interpreter

env = test_code_clean_interpreter.env  # the fixture: one environment per sandbox mode


@dataclass(frozen=True)
class Payload:
    """`tests`: assert strings, or {"inputs", "outputs"} (stdin/stdout); `want`: the reward, or
    None for BAD_TASK; `why`: a phrase the failure's reason must hold (a forgery scored 0)."""

    tests: Any
    code: str
    want: float | None
    why: str = ""


def answers(value: str) -> str:
    """A preamble: the solution's process answers every call with `value` (wire form), whatever
    its functions compute."""
    return test_code_clean_interpreter.hijack(f"lambda req: {value}")


ERRORS: dict[str, Payload] = {
    "test_nested_brackets": Payload(["assert f() == " + "[" * 100_000], "def f():\n    return 1\n", None),
    "test_unary_chain": Payload(["assert f() == " + "-" * 500_000 + "1"], "def f():\n    return -1\n", None),
    "test_long_sum": Payload(["assert f() == " + "1+" * 100_000 + "1"], "def f():\n    return 1\n", None),
    "test_attribute_chain": Payload(["assert f()" + ".x" * 200_000], "def f():\n    return 1\n", None),
    "unit_tests_nested_argument": Payload(
        {"unit_tests": {"inputs": ["[" * 50_000 + "]" * 50_000], "outputs": ["1"], "fn_name": "f"}},
        "class Solution:\n    def f(self, x):\n        return 1\n",
        None,
    ),
    "unit_tests_literal_too_deep_to_compile": Payload(
        {"unit_tests": {"inputs": ["[" * 300 + "]" * 300], "outputs": ["1"], "fn_name": "f"}},
        "class Solution:\n    def f(self, x):\n        return 1\n",
        None,
    ),
    "key_of_its_own_compared": Payload(
        ["assert pairs() == {(1, 2): 3}"],
        "class P:\n    def __eq__(self, o):\n        return True\n"
        "    def __hash__(self):\n        return hash((1, 2))\n"
        "def pairs():\n    return {P(): 3}\n",
        0.0,
        "AssertionError",
    ),
    "forged_reference_key": Payload(
        ["assert pairs() == {(1, 2): 3}"],
        answers("['dict', [[['ref', 7], 3]]]") + "def pairs():\n    return {}\n",
        0.0,
        "AssertionError",
    ),
    "keys_of_its_own_counted": Payload(
        ["d = pairs()\nassert len(d) == 2 and sorted(d.values()) == [3, 4]"],
        "class P:\n    pass\ndef pairs():\n    return {P(): 3, P(): 4}\n",
        1.0,
    ),
}

_SORT_TESTS = ["xs = [3, 1, 2]\nassert drain(plan(xs)) == sorted(xs)", "assert drain(plan([2, 1])) == [1, 2]"]
_SORT_HONEST = "def plan(xs):\n    return sorted(xs)\ndef drain(steps):\n    return list(steps)\n"
_NAMES_TABLE = (  # the solution's process reports NAMES as its globals
    "import gc\n"
    "for _o in gc.get_objects():\n"
    "    if type(_o).__name__ == 'Runner':\n"
    "        type(_o).names = lambda self: NAMES\n"
)

NAMES: dict[str, Payload] = {
    # 1. a name the solution reports never picks code for the clean interpreter to run
    "honest_plan_and_drain": Payload(_SORT_TESTS, _SORT_HONEST, 1.0),
    "drain_is_eval": Payload(_SORT_TESTS, "drain = eval\ndef plan(xs):\n    return 'sorted(xs)'\n", 0.0),
    "drain_imported_as_eval": Payload(
        _SORT_TESTS, "from builtins import eval as drain\ndef plan(xs):\n    return 'sorted(xs)'\n", 0.0
    ),
    "drain_is_a_partial_of_eval": Payload(
        _SORT_TESTS,
        "import functools\ndrain = functools.partial(eval)\ndef plan(xs):\n    return 'sorted(xs)'\n",
        0.0,
    ),
    "names_table_says_builtins_eval": Payload(
        _SORT_TESTS,
        "NAMES = [['drain', 'imported', ['builtins', 'eval']], ['plan', 'own', None]]\n"
        + _NAMES_TABLE
        + "def drain(x):\n    return x\ndef plan(xs):\n    return 'sorted(xs)'\n",
        0.0,
    ),
    "names_table_says_module_builtins": Payload(
        _SORT_TESTS,
        "NAMES = [['drain', 'module', 'builtins'], ['plan', 'own', None]]\n"
        + _NAMES_TABLE
        + "def drain(x):\n    return x\ndef plan(xs):\n    return 'sorted(xs)'\n",
        0.0,
    ),
    "names_table_claims_a_module_for_the_tests_helper": Payload(
        ["import math\nassert fact(5) == math.factorial(5)", "assert fact(3) == sorted([6])[0]"],
        "NAMES = [['fact', 'module', 'math'], ['sorted', 'module', 'sorted']]\n"
        + _NAMES_TABLE
        + "def fact(n):\n    return 0\n",
        0.0,
    ),
    # 2. the solution's own definitions shadow builtins and standard modules, as in one interpreter
    "pow_wrong": Payload(["assert pow(2, 3) == 8"], "def pow(a, b):\n    return 0\n", 0.0),
    "pow_right": Payload(
        ["assert pow(2, 3) == 8", "assert pow(5, 0) == 1"], "def pow(a, b):\n    return a ** b\n", 1.0
    ),
    "pow_from_math": Payload(["assert pow(2, 3) == 8"], "from math import pow\n", 1.0),
    "max_wrong": Payload(["assert max([1, 5, 2]) == 5"], "def max(xs):\n    return 0\n", 0.0),
    "round_half_up_right": Payload(
        ["assert round(2.5) == 3 and round(3.5) == 4 and round(-2.5) == -3"],
        "import math\ndef round(x):\n    return int(math.copysign(math.floor(abs(x) + 0.5), x))\n",
        1.0,
    ),
    "round_wrong": Payload(["assert round(3.7) == 4"], "def round(x):\n    return 0\n", 0.0),
    "bisect_right": Payload(
        ["assert bisect([1, 3, 5], 4) == 2", "assert bisect([], 1) == 0"],
        "def bisect(xs, x):\n    return sum(1 for v in xs if v <= x)\n",
        1.0,
    ),
    "select_right": Payload(
        ["assert select([3, 1, 2], 0) == 1"], "def select(xs, k):\n    return sorted(xs)[k]\n", 1.0
    ),
    "statistics_class_right": Payload(
        ["s = statistics([1, 2, 3])\nassert s.mean() == 2"],
        "class statistics:\n    def __init__(self, xs):\n        self.xs = xs\n"
        "    def mean(self):\n        return sum(self.xs) / len(self.xs)\n",
        1.0,
    ),
    "shadowed_helper_beside_the_tested_name": Payload(
        ["assert square(3) == pow(3, 2)", "assert total([1, 2]) == sum([1, 2])"],
        "def pow(a, b):\n    return 0\nsum = lambda xs: 0\n"
        "def square(x):\n    return 0\ndef total(xs):\n    return 0\n",
        0.0,
    ),
    "a_global_named_like_the_tests_variable": Payload(
        ["n = 3\nassert pow(n, 2) == 9"], "n = 1\ndef pow(a, b):\n    return 0\n", 0.0
    ),
    "through_import_solution": Payload(
        ["import solution\nassert solution.pow(2, 3) == 8"], "def pow(a, b):\n    return 0\n", 0.0
    ),
}

_IO = {"inputs": ["3 4\n", "5 6\n"], "outputs": ["7\n", "11\n"]}

_LARGE = "".join(f"{i}\n" for i in range(100_000))  # ~0.6 MB: more than a pipe holds by default
_HUGE = "1 2\n" + "9" * 3_000_000 + "\n"  # more than a pipe can hold: fed while the program reads

STDIO: dict[str, Payload] = {
    "large_input_read_whole": Payload(
        {"inputs": [_LARGE], "outputs": [str(sum(range(100_000)))]},
        "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))\n",
        1.0,
    ),
    "huge_input_read_in_part": Payload(
        {"inputs": [_HUGE, "3 4\n"], "outputs": ["3", "7"]},
        "a, b = map(int, input().split())\nprint(a + b)\n",
        1.0,
    ),
    "exit_after_print": Payload(_IO, "a, b = map(int, input().split())\nprint(a + b)\nexit()\n", 1.0),
    "quit_after_print": Payload(_IO, "a, b = map(int, input().split())\nprint(a + b)\nquit(0)\n", 1.0),
    "stdin_buffer": Payload(
        _IO, "import sys\na, b = map(int, sys.stdin.buffer.read().split())\nprint(a + b)\n", 1.0
    ),
    "open_fd_0": Payload(_IO, "a, b = map(int, open(0).read().split())\nprint(a + b)\n", 1.0),
    "os_read_fd_0": Payload(_IO, "import os\na, b = map(int, os.read(0, 100).split())\nprint(a + b)\n", 1.0),
    "os_write_fd_1": Payload(
        _IO, "import os\na, b = map(int, input().split())\nos.write(1, f'{a + b}\\n'.encode())\n", 1.0
    ),
    "fileinput": Payload(
        _IO,
        "import fileinput\nfor line in fileinput.input():\n"
        "    a, b = map(int, line.split())\n    print(a + b)\n",
        1.0,
    ),
    "stdout_buffer": Payload(
        _IO,
        "import sys\na, b = map(int, input().split())\nsys.stdout.buffer.write(b'%d\\n' % (a + b))\n",
        1.0,
    ),
    "open_fd_1_never_closed": Payload(
        _IO,
        "out = open(1, 'w', closefd=False)\na, b = map(int, input().split())\nout.write(str(a + b))\n",
        1.0,
    ),
    "print_then_os_write_ordered_as_python": Payload(
        {"inputs": ["1\n"], "outputs": ["b\na\n"]},
        "import os\ninput()\nprint('a')\nos.write(1, b'b\\n')\n",
        1.0,
    ),
    "fast_exit_after_flush": Payload(
        _IO,
        "import os, sys\na, b = map(int, sys.stdin.readline().split())\n"
        "sys.stdout.write(str(a + b) + '\\n')\nsys.stdout.flush()\nos._exit(0)\n",
        1.0,
    ),
    "exit_code_after_right_output": Payload(
        _IO, "a, b = map(int, input().split())\nprint(a + b)\nexit(1)\n", 0.0, "SystemExit: 1"
    ),
    "answer_on_stderr": Payload(
        _IO,
        "import sys\na, b = map(int, input().split())\nprint(a + b, file=sys.stderr)\n",
        0.0,
        "wrong output",
    ),
    "os_exit_loses_buffered_output": Payload(
        _IO, "import os\na, b = map(int, input().split())\nprint(a + b)\nos._exit(0)\n", 0.0, "wrong output"
    ),
    "redirect_fd_1_away": Payload(
        _IO,
        "import os\nos.dup2(2, 1)\na, b = map(int, input().split())\nprint(a + b)\n",
        0.0,
        "wrong output",
    ),
}

_NT = "from collections import namedtuple\nStats = namedtuple('Stats', 'total count')\n"
VALUES: dict[str, Payload] = {
    "namedtuple_fields": Payload(
        [
            "r = stats([1, 2, 3])\nassert r.total == 6 and r.count == 3",
            "assert stats([4])._asdict() == {'total': 4, 'count': 1}",
        ],
        _NT + "def stats(xs):\n    return Stats(sum(xs), len(xs))\n",
        1.0,
    ),
    "namedtuple_equals_its_tuple": Payload(
        ["assert stats([1, 2]) == (3, 2)", "t, c = stats([5])\nassert (t, c) == (5, 1)"],
        _NT + "def stats(xs):\n    return Stats(sum(xs), len(xs))\n",
        1.0,
    ),
    "typing_namedtuple": Payload(
        ["assert best([3, 9]).value == 9"],
        "from typing import NamedTuple\nclass Best(NamedTuple):\n    value: int\n    index: int\n"
        "def best(xs):\n    return Best(max(xs), xs.index(max(xs)))\n",
        1.0,
    ),
    "namedtuple_with_a_lying_eq": Payload(
        ["assert stats([1, 2]) == (3, 2)"],
        _NT
        + "class S(Stats):\n    def __eq__(self, o):\n        return True\n    __hash__ = tuple.__hash__\n"
        "def stats(xs):\n    return S(0, 0)\n",
        0.0,
    ),
    "namedtuple_with_a_field_named_eq": Payload(
        ["assert stats([1, 2]) == (3, 2)"],
        answers("['namedtuple', ['Stats', ['__eq__', 'count'], [0, 0]]]") + "def stats(xs):\n    return 0\n",
        0.0,
        "AssertionError",
    ),
    "namedtuple_named_as_code": Payload(
        ["assert stats([1, 2]) == (3, 2)"],
        answers("['namedtuple', ['S; import os', ['a', 'b'], [3, 2]]]") + "def stats(xs):\n    return 0\n",
        0.0,
        "does not decode",
    ),
    "range_result": Payload(
        ["assert evens(6) == range(0, 6, 2)"], "def evens(n):\n    return range(0, n, 2)\n", 1.0
    ),
    "list_where_a_range_is_expected": Payload(
        ["assert evens(6) == range(0, 6, 2)"], "def evens(n):\n    return [0, 2, 4]\n", 0.0
    ),
    "range_argument": Payload(
        ["assert span(range(2, 9, 3)) == (2, 9, 3)"],
        "def span(r):\n    return (r.start, r.stop, r.step)\n",
        1.0,
    ),
    "counter_most_common": Payload(
        ["assert tally('abca').most_common(1) == [('a', 2)]"],
        "from collections import Counter\ndef tally(s):\n    return Counter(s)\n",
        1.0,
    ),
    "defaultdict_default": Payload(
        ["d = groups(['ab', 'c'])\nassert d[2] == ['ab'] and d[5] == []"],
        "from collections import defaultdict\ndef groups(ws):\n    d = defaultdict(list)\n"
        "    for w in ws:\n        d[len(w)].append(w)\n    return d\n",
        1.0,
    ),
    "ordered_dict_order_matters": Payload(
        ["from collections import OrderedDict\nassert ordered() == OrderedDict([('a', 1), ('b', 2)])"],
        "from collections import OrderedDict\ndef ordered():\n    return OrderedDict([('b', 2), ('a', 1)])\n",
        0.0,
    ),
    "keys_view_equals_a_set": Payload(
        ["assert names({'a': 1, 'b': 2}) == {'a', 'b'}"], "def names(d):\n    return d.keys()\n", 1.0
    ),
    "generator_consumed_as_python_would": Payload(
        ["assert list(upto(3)) == [0, 1, 2] and next(upto(3)) == 0"],
        "def upto(n):\n    i = 0\n    while i < n:\n        yield i\n        i += 1\n",
        1.0,
    ),
    "generator_is_not_a_list": Payload(
        ["assert upto(3) == [0, 1, 2]"], "def upto(n):\n    return (i for i in range(n))\n", 0.0
    ),
    "asyncio_in_the_solution": Payload(
        ["assert run(2) == 4"],
        "import asyncio\nasync def twice(x):\n    await asyncio.sleep(0)\n    return 2 * x\n"
        "def run(x):\n    return asyncio.run(twice(x))\n",
        1.0,
    ),
    "unittest_mock_in_the_solution": Payload(
        ["assert calls() == 2"],
        "from unittest import mock\ndef calls():\n    m = mock.Mock(return_value=1)\n    m()\n    m()\n"
        "    return m.call_count\n",
        1.0,
    ),
}

CLASSES = {"errors": ERRORS, "names": NAMES, "stdio": STDIO, "values": VALUES}


def _meta(tests: Any) -> dict[str, Any]:
    if isinstance(tests, dict) and "unit_tests" in tests:
        return dict(tests)
    return {"tests": tests}


async def _score(env: Environment, payload: Payload) -> tuple[float | None, dict[str, Any]]:
    meta = _meta(payload.tests)
    try:
        got = await check(env, task(None, verifier_metadata=meta), answer(f"```python\n{payload.code}```"))
    except BadTask as exc:
        return None, {"reason": str(exc)}
    return got.reward, got.details


@pytest.mark.parametrize("klass", list(CLASSES))
async def test_each_payload_scores_as_one_interpreter_would(env: Environment, klass: str) -> None:
    wrong = []
    for name, payload in CLASSES[klass].items():
        got, details = await _score(env, payload)
        reason = str(details.get("reason", "")) + str(details.get("cases", ""))
        if got != payload.want or (payload.why and payload.why not in reason):
            wrong.append(f"{name}: got {got}, want {payload.want}: {reason[:400]}")
    assert not wrong, "\n".join(wrong)


def test_the_suite_holds_enough_payloads() -> None:
    assert sum(map(len, CLASSES.values())) >= 35
    for payloads in CLASSES.values():  # each class: forgeries that score 0, and a right answer or a bad task
        assert {p.want for p in payloads.values()} - {0.0}, payloads
