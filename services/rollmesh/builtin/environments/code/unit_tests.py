"""NeMo Gym's code rows, as they are: `verifier_metadata.unit_tests = {"inputs", "outputs", "fn_name"}`
(LiveCodeBench's format, which NeMo Gym's code_gen server checks) as the code environment's tests.

- No `fn_name` (stdin/stdout programs): case i runs the program with `inputs[i]` on stdin and
  compares its stdout with `outputs[i]` (the `io` tests).
- `fn_name` (function-call style, LiveCodeBench's LeetCode problems): each line of `inputs[i]` is
  one JSON argument, `outputs[i]` the JSON of the return value; the case is
  `assert Solution().<fn_name>(args...) == <value>` (a float value: equal within
  LiveCodeBench's tolerance, relative 1e-5 and absolute 1e-8), checked as every assert is.

What no answer could pass is a reason string (the caller's BadTask): lists of unequal length,
a case that is not text, an argument or value that is not JSON or has no Python literal (NaN),
an `fn_name` that is not an identifier.

Where the verdicts can differ from LiveCodeBench's: stdout lines are compared after trailing
whitespace only (LiveCodeBench strips both ends and also accepts lines that are equal as
decimals, `1.0` for `1`); a solution that returns a tuple where a list is expected fails here
(LiveCodeBench turns it into a list); the function is always `Solution().<fn_name>`
(LiveCodeBench calls a module-level function when the code has no `class Solution`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from rollmesh.verifier.sandbox.core import TestSpec

WHERE = "verifier_metadata.unit_tests"


def unit_tests_spec(raw: Any) -> TestSpec | str:
    """The tests of a `unit_tests` object, or why none could pass (module docstring)."""
    if not isinstance(raw, Mapping):
        return f"{WHERE} must be an object with inputs and outputs"
    ins, outs, fn_name = raw.get("inputs"), raw.get("outputs"), raw.get("fn_name")
    if not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs) or not ins:
        return f"{WHERE}.inputs and .outputs must be non-empty lists of equal length"
    bad = next((i for i, v in enumerate([*ins, *outs]) if not isinstance(v, str)), None)
    if bad is not None:
        which = "inputs" if bad < len(ins) else "outputs"
        return f"{WHERE}.{which}[{bad % len(ins)}] must be a string"
    if fn_name is None:
        return TestSpec("io", [{"input": i, "output": o} for i, o in zip(ins, outs, strict=True)])
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        return f"{WHERE}.fn_name must be a Python identifier, not {fn_name!r}"
    cases: list[str] = []
    for n, (arguments, expected) in enumerate(zip(ins, outs, strict=True)):
        case = _call_case(fn_name, arguments, expected)
        if case.startswith("!"):
            return f"{WHERE} case {n}: {case[1:]}"
        cases.append(case)
    return TestSpec("asserts", cases)


def _call_case(fn_name: str, arguments: str, expected: str) -> str:
    """The assert of one function-call case, or "!why" when it has none."""
    try:
        args = [json.loads(line) for line in arguments.split("\n")]
        value = json.loads(expected)
        literals = [_literal(a) for a in (*args, value)]
    except ValueError as exc:
        return f"!not JSON ({exc})"
    except RecursionError:
        return "!a value nested too deeply"
    if any(lit is None for lit in literals):
        return "!a value with no Python literal (NaN or infinity)"
    call = f"Solution().{fn_name}({', '.join(str(lit) for lit in literals[:-1])})"
    if isinstance(value, float):
        return f"import math\nassert math.isclose({call}, {literals[-1]}, rel_tol=1e-05, abs_tol=1e-08)"
    return f"assert {call} == {literals[-1]}"


def _literal(value: Any) -> str | None:
    """Python source for a JSON value (None when it has none: NaN, infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        items = [_literal(v) for v in value]
        return None if None in items else f"[{', '.join(str(i) for i in items)}]"
    if isinstance(value, dict):
        pairs = [(repr(k), _literal(v)) for k, v in value.items()]
        return (
            None if any(v is None for _, v in pairs) else "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
        )
    return repr(value)
