"""The verdict of every test, computed in the verifier. Nothing here runs untrusted code.

A test case is Python source (usually `assert f(1) == 2`). It is parsed here and interpreted
statement by statement: `assert`, `for`, `if`, `pass`, `raise`, assignments of values computed
here, and `import math` / `from math import ...` (and `random`: its draws are made here, on a
generator of this checker's own) run in this interpreter. Inside an expression,
comparisons, boolean logic, arithmetic (size-bounded), containers, subscripts, comprehensions,
`math.*` and pure builtins (`SAFE_FUNCS`: the real ones, whatever the solution rebinds) are
evaluated here too. Every other sub-expression, typically a call into the solution, is a *probe*:
its source, plus the values of the comprehension/loop variables it names, goes to the sandbox
(`Child.eval`), and what comes back is decoded strictly into plain data (`sandbox_values`).
Other statements (`s = Solution()`, `s.push(1)`, a helper `def`) run in the sandbox (`Child.exec`),
and names they bind are probed from then on. A list, dict, set or bytearray of the tests that a
call made for its effect (`rev(x)`, or `rev(x) is None` when it returned None) changes in place comes
back (decoded strictly) and changes here too.

A function the tests define with asserts in it (HumanEval's `def check(candidate)`) is
interpreted here as well: arguments computed here are passed as values, others (the solution's
function) by reference, their source put in place of the parameter in each probe (`_Ref`).

A helper without asserts whose body is made only of statements interpreted here (assignments,
`+=`, `if`, `for`, `return`, `assert`, `pass`; no method calls, no calls for side effects), and
that does not call itself, is
interpreted here too when the tests call it directly (`assert is_valid(f(3))`,
`for a, b in cases(): ...`): a solution that rewrites the runner cannot make it return True or an
empty list of cases. It is also defined in the sandbox, for probes that pass it to the solution.

So the expected values and the comparison never enter the sandbox, and a value whose `__eq__`
lies cannot reach the comparison. A probe whose value is an object of the code's own (`NotPlain`)
fails its case, unless that probe is itself the argument of a pure builtin call, the operand of a
truth test or of `is None`: that call or test is then probed whole (`Checker._opaque`).
A statement that would need an `assert` to run in the sandbox
(inside a `while`, `with`, `try`, or a helper too complex to interpret) is refused as
unverifiable: the case fails with that reason. What a probe's arguments contain (inputs, loop
variables) is visible to the solution; a helper without asserts that is too complex to interpret
here (a `while`, a `try`, recursion) runs in the sandbox, so its answer is a claim.
"""

from __future__ import annotations

import ast
import copy
import functools
import math
import operator
import random
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, Protocol

from rollmesh.verifier._sandbox_runner import encode
from rollmesh.verifier.errors import BadValue, CaseFailed, ChannelBroken, NotPlain, ProbeError
from rollmesh.verifier.sandbox_values import MAX_SAME_HASH, check_hashes, checked_decimal, decode_value

MAX_BITS = 1 << 16  # ints built here (**, <<) stay below this many bits
MAX_LEN = 1 << 20  # sequences built here (*, range) stay below this many items
MAX_STEPS = 200_000  # loop iterations and probes per case
MAX_HELPER_DEPTH = 16
_HELPER_SCOPE = " helper"  # a key no identifier can be: marks a helper's local scope


class Child(Protocol):
    """The sandboxed process, as the checker sees it. `exec`/`eval` raise `ProbeError` when the code
    there failed; anything that breaks the channel (crash, timeout, malformed reply) propagates."""

    async def exec(self, src: str, bind: dict[str, Any], keep: Collection[str] = ()) -> dict[str, Any]:
        """Run a statement; `keep`: names of `bind` it binds (they move to the sandbox). Returns
        the other values of `bind` the statement changed in place, decoded."""
        ...

    async def eval(self, src: str, bind: dict[str, Any]) -> Any: ...


def eval_result(src: str, reply: dict[str, Any]) -> Any:
    """The value of the runner's reply to `eval src`, decoded strictly; ProbeError (NotPlain for
    an object of the code's own) when there is none."""
    if "error" in reply:
        raise (NotPlain if reply.get("opaque") is True else ProbeError)(f"{src[:80]}: {reply['error']}")
    if "value" not in reply:
        raise ChannelBroken("a reply to eval without a value")
    try:
        return decode_value(reply["value"])
    except BadValue as exc:
        raise ProbeError(f"{src[:80]}: {exc}") from None


def _small_ints(values: tuple[Any, ...]) -> tuple[Any, ...]:
    if any(type(v) is int and abs(v) > 10_000 for v in values):
        raise CaseFailed("round() to more than 10000 digits is not checked")
    return values


def _hash_checked(args: tuple[Any, ...]) -> tuple[Any, ...]:
    if args:
        items = list(_as_iterable(args[0]))
        check_hashes(items)
        return (items,)
    return args


def _safe_dict(*args: Any, **kwargs: Any) -> dict[Any, Any]:
    if args and not isinstance(args[0], dict):  # a dict argument was checked when it was built
        pairs = [tuple(p) for p in _as_iterable(args[0])]
        check_hashes(p[0] for p in pairs if len(p) == 2)
        return dict(pairs, *args[1:], **kwargs)
    return dict(*args, **kwargs)


def _bounded_range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_LEN:
        raise CaseFailed(f"range of {len(r)} items is too large to check")
    return r


SAFE_FUNCS: dict[str, Any] = {
    f.__name__: f
    for f in (
        abs,
        all,
        any,
        bool,
        chr,
        complex,
        divmod,
        enumerate,
        float,
        int,
        isinstance,
        len,
        list,
        max,
        min,
        ord,
        repr,
        sorted,
        str,
        sum,
        tuple,
        type,
        zip,
    )
} | {
    "range": _bounded_range,
    "reversed": lambda x: list(reversed(x)),
    "round": lambda x, *nd: round(x, *_small_ints(nd)),
    "set": lambda *a: set(*_hash_checked(a)),
    "frozenset": lambda *a: frozenset(*_hash_checked(a)),
    "dict": lambda *a, **k: _safe_dict(*a, **k),
}
MATH_NAMES = (
    "isclose sqrt floor ceil fabs isnan isinf isfinite log log2 log10 exp sin cos tan atan2 hypot gcd "
    "trunc copysign pi e tau inf nan"
).split()
TRUSTED_MODULES = frozenset({"math", "random", "fractions", "decimal", "collections"})
"""Modules whose functions run here (`Checker.modules`): a test's inputs drawn from `random` are the
test's, not claims of a sandbox whose `random` the solution may have patched; `Fraction(1, 3)`,
`Decimal('0.1')`, `deque([1, 2])` are the test's expected values (an answer of these types comes
back as data: `sandbox_values`)."""


def _fraction(*args: Any) -> Fraction:
    """`Fraction(...)` of the tests': one from a string or Decimal with a large exponent would cost
    its 10**exponent here."""
    for arg in args:
        if isinstance(arg, str):
            checked_decimal(arg.split("/")[0].strip())
        elif isinstance(arg, Decimal) and arg.is_finite():
            checked_decimal(str(arg))
    return Fraction(*args)


def _decimal(value: Any = "0") -> Decimal:
    return checked_decimal(value) if isinstance(value, str) else Decimal(value)


_MATH = {n: getattr(math, n) for n in MATH_NAMES}  # taken at import: nothing can have patched them yet


def _small(k: Any) -> Any:
    if type(k) is int and k > MAX_LEN:
        raise CaseFailed(f"{k} random items are too many to check")
    return k


def trusted_modules() -> dict[str, dict[str, Any]]:
    """The functions of TRUSTED_MODULES, `random`'s on a generator of their own (one per checker,
    seeded only by the tests' `random.seed`)."""
    rng = random.Random()
    draws = "seed random randint randrange choice shuffle uniform".split()
    return {
        "math": _MATH,
        "fractions": {"Fraction": _fraction},
        "decimal": {"Decimal": _decimal},
        "collections": {"deque": lambda *a: deque(*a)},
        "random": {n: getattr(rng, n) for n in draws}
        | {
            "sample": lambda population, k, **kw: rng.sample(population, _small(k), **kw),
            "choices": lambda population, weights=None, *, cum_weights=None, k=1: rng.choices(
                population, weights, cum_weights=cum_weights, k=_small(k)
            ),
        },
    }


_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_,
    ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.Not: operator.not_,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_PLAIN_CONSTANTS = (type(None), bool, int, float, complex, str, bytes)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    if isinstance(op, ast.Pow) and type(a) is int and type(b) is int and abs(a) > 1 and b > 0:
        if b * a.bit_length() > MAX_BITS:
            raise CaseFailed(f"{a.bit_length()}-bit ** {b} is too large to check")
    if isinstance(op, ast.Pow) and type(a) is Fraction and type(b) is int:
        if abs(b) * (a.numerator.bit_length() + a.denominator.bit_length()) > MAX_BITS:
            raise CaseFailed("Fraction ** too large to check")
    if isinstance(op, ast.LShift) and type(b) is int and b > MAX_BITS:
        raise CaseFailed("<< too large to check")
    if isinstance(op, ast.Mod) and isinstance(a, (str, bytes)):
        args = b if isinstance(b, tuple) else (b,)
        if any(type(x) is int and abs(x) > MAX_LEN for x in args):
            raise CaseFailed("%-formatting with a huge number is not checked")
    if isinstance(op, ast.Mult):
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, bytes, list, tuple)) and type(n) is int and len(seq) * n > MAX_LEN:
                raise CaseFailed("repeated sequence too large to check")
    return _BINOPS[type(op)](a, b)


def _unverifiable(stmt: ast.stmt) -> str | None:
    """Why `stmt` (sent to the sandbox) would put a verdict there, else None."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Assert):
            kind = type(stmt).__name__.lower()
            return f"line {node.lineno}: an assert inside a {kind} would run in the sandbox"
    return None


def unverifiable_case(source: str) -> str | None:
    """Why a test case can never give a verdict whatever the solution does (it does not parse,
    or an assert of it would have to run in the sandbox), else None. Mirrors `Checker._stmt`'s
    dispatch without running anything: a task whose tests fail this is a bad task, not a 0."""
    try:
        tree = ast.parse(source, "test", "exec")
    except SyntaxError as exc:
        return f"the test does not parse: {exc}"
    why = _static_block(tree.body)
    return f"unverifiable test, {why}" if why else None


def _static_block(body: list[ast.stmt]) -> str | None:
    for stmt in body:
        if isinstance(stmt, ast.If):
            why = _static_block(stmt.body) or _static_block(stmt.orelse)
        elif isinstance(stmt, ast.For) and not stmt.orelse and _target_names(stmt.target) is not None:
            why = _static_block(stmt.body)
        elif isinstance(stmt, ast.FunctionDef) and _helper_ok(stmt):
            why = _static_block(stmt.body)
        elif isinstance(stmt, ast.Assert):
            why = None
        else:
            why = _unverifiable(stmt)
        if why:
            return why
    return None


def _names_bound(stmt: ast.stmt) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


@dataclass
class Checker:
    """Runs the cases of one run against one `Child`, in order. `values` holds names whose values
    live here (trusted assignments, math imports); `child_names` those bound in the sandbox by the
    tests' own statements (their later uses are probed)."""

    child: Child
    values: dict[str, Any] = field(default_factory=dict)
    child_names: set[str] = field(default_factory=set)
    steps: int = 0
    no_probes: bool = False
    depth: int = 0
    modules: dict[str, dict[str, Any]] = field(default_factory=trusted_modules)
    imported: set[str] = field(default_factory=set)  # names the tests' own imports bound in the sandbox
    hash_counts: dict[str, tuple[Any, dict[int, int], int]] = field(default_factory=dict)  # `_merge_counts`

    async def check(self, source: str) -> None:
        """Raises CaseFailed (or ProbeError) unless every statement of the case holds."""
        self.steps = 0
        try:
            tree = ast.parse(source, "test", "exec")
        except SyntaxError as exc:
            raise CaseFailed(f"the test does not parse: {exc}") from None
        try:
            await self._block(tree.body, {})
        except (CaseFailed, ProbeError, ChannelBroken):
            raise
        except Exception as exc:  # what the test's own expression raised here: 1 / 0, a TypeError
            raise CaseFailed(f"{type(exc).__name__}: {exc}"[:300]) from None

    # -- statements -------------------------------------------------------------------------------------

    async def _block(self, body: list[ast.stmt], local: dict[str, Any]) -> None:
        for stmt in body:
            await self._stmt(stmt, local)

    async def _stmt(self, stmt: ast.stmt, local: dict[str, Any]) -> None:
        if isinstance(stmt, ast.Assert):
            if not await self._truth(stmt.test, local):
                raise CaseFailed(f"assert failed (line {stmt.lineno} of the case)")
        elif isinstance(stmt, ast.Pass):
            return
        elif isinstance(stmt, ast.If):
            branch = stmt.body if await self._truth(stmt.test, local) else stmt.orelse
            await self._block(branch, local)
        elif isinstance(stmt, ast.For) and not stmt.orelse and _target_names(stmt.target) is not None:
            for item in await self._iterate(stmt.iter, local):
                _bind(stmt.target, item, local)
                await self._block(stmt.body, local)
        elif isinstance(stmt, ast.Raise):
            raise CaseFailed(f"the test raised: {ast.unparse(stmt)[:200]}")
        elif isinstance(stmt, ast.Return) and _HELPER_SCOPE in local:
            raise _Return(None if stmt.value is None else await self._eval(stmt.value, local))
        elif isinstance(stmt, ast.FunctionDef) and _unverifiable(stmt) and _helper_ok(stmt):
            self._store(stmt.name, _Helper(stmt), local)
        elif isinstance(stmt, ast.FunctionDef) and _helper_ok(stmt) and _interpretable(stmt):
            if self.no_probes:
                raise _NeedsProbe
            await self.child.exec(*self._for_child(stmt, local))  # probes that name it find it there
            self._store(stmt.name, _Helper(stmt), local)  # calls made from here are interpreted here
        elif (
            isinstance(stmt, ast.AugAssign)
            and isinstance(stmt.target, ast.Name)
            and type(stmt.op) in _BINOPS
            and not isinstance(current := self._resolve(stmt.target.id, local), (_Unresolved, _Ref))
            and (stmt.target.id in local or stmt.target.id in self.values)
        ):
            value = await self._eval(stmt.value, local)
            counts = None
            if isinstance(stmt.op, (ast.BitOr, ast.BitXor)) and isinstance(value, (set, frozenset, dict)):
                counts = self._merge_counts(stmt.target.id, current, value)
            result = _binop(stmt.op, current, value)
            self._store(stmt.target.id, result, local)
            self.hash_counts.pop(stmt.target.id, None)
            if counts is not None and isinstance(stmt.op, ast.BitOr):  # keys only added: counts hold
                self.hash_counts[stmt.target.id] = (result, counts, len(result))
        elif (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and self._runs_here(stmt.value, local)
        ):
            await self._eval(stmt.value, local)  # a helper of the tests', `random.shuffle(xs)`
        elif (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(target := stmt.targets[0], ast.Subscript)
            and isinstance(target.value, ast.Name)
            and type(container := self._resolve(target.value.id, local)) in (list, dict)
            and not isinstance(target.slice, ast.Slice)
            and _hash_safe(key := await self._eval_here(target.slice, local))
        ):
            container[key] = await self._eval(stmt.value, local)  # `res[n] = f(n)`: res is the test's
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            await self._import(stmt, local)
        elif (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and (value := await self._eval_here(stmt.value, local)) is not _UNRESOLVED
        ):
            self._store(stmt.targets[0].id, value, local)
        else:
            why = _unverifiable(stmt)
            if why:
                raise CaseFailed(f"unverifiable test, {why}")
            if self.no_probes:
                raise _NeedsProbe
            bound = _names_bound(stmt)
            src, binds = self._for_child(stmt, local)
            changed = await self.child.exec(src, binds, bound & set(binds))
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and self._solutions(stmt.value, local)
            ):
                self._carry_back(changed, local)
            for name in bound:
                local.pop(name, None)
                self.values.pop(name, None)
                self.child_names.add(name)

    def _merge_counts(self, name: str, current: Any, more: Collection[Any]) -> dict[int, int]:
        """`s |= f(n)` in a loop: each answer holds at most 16 keys of one hash (decoding checks),
        but they add up in `s`, and a set of n keys of one hash costs n**2 here (2000 rounds of 16:
        6.9 s on the event loop). The keys of `s` per hash are counted once and kept while `s` is
        the value the last `|=` made, so a round costs what its new keys do; a merge that would put
        more than MAX_SAME_HASH keys on one hash fails the case."""
        if not isinstance(current, (set, frozenset, dict)):
            return {}
        cached = self.hash_counts.get(name)
        if cached is not None and cached[0] is current and cached[2] == len(current):  # not changed since
            counts = cached[1]  # over-counted if this merge fails: the case fails anyway
        else:
            counts = {}
            for key in current:
                counts[hash(key)] = counts.get(hash(key), 0) + 1
        for key in more:
            if key not in current:
                h = hash(key)
                counts[h] = counts.get(h, 0) + 1
                if counts[h] > MAX_SAME_HASH:
                    raise CaseFailed(f"more than {MAX_SAME_HASH} keys of one hash merged into {name!r}")
        return counts

    def _carry_back(self, changed: dict[str, Any], local: dict[str, Any]) -> None:
        for name, value in changed.items():
            _update_in_place(local[name] if name in local else self.values.get(name), value)

    async def _returns_none(self, call: ast.Call, local: dict[str, Any]) -> bool:
        """`f(x) is None` for the solution's `f`: true when `f` returned None, and then what it
        changed in place in the values of the tests' it was given changes here too, as after the
        statement `f(x)` (its answer carries nothing but its effect; after `out = f(x)` or
        `f(x) is not None` the values stay the test's: see `_update_in_place`)."""
        src, binds = self._for_child(call, local)
        changed = await self.child.exec(f"{_NONE_FLAG} = ({src}) is None", binds)
        returned_none = await self.child.eval(_NONE_FLAG, {})
        if type(returned_none) is not bool:
            raise CaseFailed(f"{src[:80]} is None: not a bool")
        if returned_none:
            self._carry_back(changed, local)
        return returned_none

    def _runs_here(self, call: ast.Call, local: dict[str, Any]) -> bool:
        """`call`'s function runs in the verifier: a helper of the tests', a pure builtin, a
        function of a trusted module."""
        func = call.func
        if isinstance(func, ast.Name):
            value = self._resolve(func.id, local)
            return isinstance(value, _Helper) or (
                value is not _UNRESOLVED and not isinstance(value, _Ref) and callable(value)
            )
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return _attribute(self._resolve(func.value.id, local), func.attr) is not _UNRESOLVED
        return False

    def _solutions(self, call: ast.Call, local: dict[str, Any]) -> bool:
        """`call`'s function is the solution's (`rev(x)`, `s.rotate(x)`, a helper's `candidate(x)`):
        not a method of a value of the test's, nor of a module the tests imported, whose claims about
        what it changed are the sandbox's, not the solution's answer."""
        root = call.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name) or root.id in self.imported:
            return False
        value = self._resolve(root.id, local)
        return value is _UNRESOLVED or isinstance(value, _Ref)

    async def _eval_here(self, node: ast.expr, local: dict[str, Any]) -> Any:
        """`node`'s value when it needs no probe (an assignment of it then stays out of the
        sandbox), else _UNRESOLVED."""
        before, self.no_probes = self.no_probes, True
        try:
            return await self._eval(node, local)
        except _NeedsProbe:
            return _UNRESOLVED
        finally:
            self.no_probes = before

    def _store(self, name: str, value: Any, local: dict[str, Any]) -> None:
        self.child_names.discard(name)
        if name in local or _HELPER_SCOPE in local:
            local[name] = value
        else:
            self.values[name] = value

    async def _import(self, stmt: ast.Import | ast.ImportFrom, local: dict[str, Any]) -> None:
        if self.no_probes:
            raise _NeedsProbe
        await self.child.exec(ast.unparse(stmt), {})
        for alias in stmt.names:
            bound = (alias.asname or alias.name).split(".")[0]
            self.child_names.discard(bound)
            if isinstance(stmt, ast.Import) and alias.name in TRUSTED_MODULES:
                self.values[bound] = _Module(alias.name, self.modules[alias.name])
            elif isinstance(stmt, ast.ImportFrom) and stmt.module in TRUSTED_MODULES and stmt.level == 0:
                table = self.modules[stmt.module]
                if alias.name in table:
                    self.values[bound] = table[alias.name]
                else:
                    self.child_names.add(bound)
                    self.imported.add(bound)
            else:
                self.values.pop(bound, None)
                self.child_names.add(bound)
                self.imported.add(bound)

    # -- expressions ------------------------------------------------------------------------------------

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise CaseFailed(f"more than {MAX_STEPS} steps in one case")

    async def _truth(self, node: ast.expr, local: dict[str, Any]) -> bool:
        if isinstance(node, ast.BoolOp):  # the truth of each operand, in order: `assert s and s.pop() == 0`
            short = isinstance(node.op, ast.Or)
            for value in node.values:
                if await self._truth(value, local) == short:
                    return short
            return not short
        try:
            return bool(await self._eval(node, local))
        except NotPlain as exc:  # `assert s`: the truth of an object of the code's own is its claim
            call = ast.Call(func=ast.Name("bool", ast.Load()), args=[node], keywords=[])
            return bool(await self._opaque(exc, (node,), call, local))

    async def _opaque(
        self, exc: NotPlain, operands: tuple[ast.expr, ...], whole: ast.expr, local: dict[str, Any]
    ) -> Any:
        """`whole` asked of the sandbox, when the probe that gave an object of the code's own
        (`exc`) was one of `operands` itself: `len(s)`, `str(s)`, `isinstance(s, Stack)`, `bool(s)`,
        `s is None` are what that code's own methods say in Python too, and any claim of theirs a
        plain value could give as well. Else (the object is deeper in an expression of the test's,
        `abs(f(x) - 0.3)`, `all(f(x) == y for ...)`) the probe's error stands: a comparison or an
        expected value never goes to the sandbox."""
        if exc.node is None or not any(exc.node is op for op in operands):
            raise exc
        value = await self._probe(whole, local)
        if type(value) is not bool and isinstance(whole, (ast.Compare, ast.UnaryOp)):
            raise CaseFailed(f"{ast.unparse(whole)[:80]} is not a bool")
        return value

    def _resolve(self, name: str, local: dict[str, Any]) -> Any:
        if name in local:
            return local[name]
        if name in self.values:
            return self.values[name]
        if name in self.child_names:
            return _UNRESOLVED
        if name in TRUSTED_MODULES:  # `math.isclose(...)` stays here even when only the code imports math
            return _Module(name, self.modules[name])
        return SAFE_FUNCS.get(name, _UNRESOLVED)

    async def _eval(self, node: ast.expr, local: dict[str, Any]) -> Any:
        self._step()
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, _PLAIN_CONSTANTS):
                raise CaseFailed(f"unsupported constant {node.value!r}")
            return node.value
        if isinstance(node, ast.Name):
            value = self._resolve(node.id, local)
            return await self._probe(node, local) if value is _UNRESOLVED else value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            if any(isinstance(e, ast.Starred) for e in node.elts):
                return await self._probe(node, local)
            items = [await self._eval(e, local) for e in node.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                return await self._probe(node, local)
            return {
                await self._eval(k, local): await self._eval(v, local)
                for k, v in zip(node.keys, node.values, strict=True)
                if k is not None
            }
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return not await self._truth(node.operand, local)
            return _UNARY[type(node.op)](await self._eval(node.operand, local))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _binop(node.op, await self._eval(node.left, local), await self._eval(node.right, local))
        if isinstance(node, ast.BoolOp):
            result: Any = None
            for value_node in node.values:
                result = await self._eval(value_node, local)
                if isinstance(node.op, ast.And) != bool(result):
                    return result
            return result
        if isinstance(node, ast.Compare):
            if (
                _is_none_check(node)
                and isinstance(node.ops[0], ast.Is)
                and isinstance(node.left, ast.Call)
                and self._solutions(node.left, local)
                and not self.no_probes
            ):
                self._step()
                return await self._returns_none(node.left, local)
            if _is_none_check(node):
                try:
                    return _COMPARE[type(node.ops[0])](await self._eval(node.left, local), None)
                except NotPlain as exc:
                    return await self._opaque(exc, (node.left,), node, local)
            left = await self._eval(node.left, local)
            for op, right_node in zip(node.ops, node.comparators, strict=True):
                right = await self._eval(right_node, local)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            chosen = node.body if await self._truth(node.test, local) else node.orelse
            return await self._eval(chosen, local)
        if isinstance(node, ast.Subscript):
            container = await self._eval(node.value, local)
            return container[await self._index(node.slice, local)]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = self._resolve(node.value.id, local)
            if isinstance(owner, _Module) and (attr := owner.get(node.attr)) is not _UNRESOLVED:
                return attr
        if isinstance(node, ast.Call):
            return await self._call(node, local)
        if isinstance(node, _COMPREHENSIONS) and all(_target_names(g.target) for g in node.generators):
            return await self._comprehension(node, local)
        return await self._probe(node, local)

    async def _index(self, node: ast.expr, local: dict[str, Any]) -> Any:
        if isinstance(node, ast.Slice):
            parts = [
                None if p is None else await self._eval(p, local) for p in (node.lower, node.upper, node.step)
            ]
            return slice(*parts)
        return await self._eval(node, local)

    async def _call(self, node: ast.Call, local: dict[str, Any]) -> Any:
        func: Any = _UNRESOLVED
        if isinstance(node.func, ast.Name):
            func = self._resolve(node.func.id, local)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            func = _attribute(self._resolve(node.func.value.id, local), node.func.attr)
        plain_args = not any(isinstance(a, (ast.Starred, ast.Lambda)) for a in node.args) and not any(
            k.arg is None or isinstance(k.value, ast.Lambda) for k in node.keywords
        )
        if isinstance(func, _Helper) and plain_args:
            return await self._call_helper(func, node, local)
        if _is_list_sort(func) and (key := next((k.value for k in node.keywords if k.arg == "key"), None)):
            if await self._eval_here(key, local) is _UNRESOLVED:  # the solution's function, a lambda
                return await self._sort_by_probed_key(node, key, func.__self__, local)
        if func is _UNRESOLVED or not callable(func) or not plain_args:
            return await self._probe(node, local)
        if func in (all, any) and len(node.args) == 1 and isinstance(node.args[0], ast.GeneratorExp):
            want = func is any
            async for item in self._generate(node.args[0], local):
                if bool(item) == want:
                    return want
            return not want
        try:
            args = [await self._eval(a, local) for a in node.args]
            kwargs = {k.arg: await self._eval(k.value, local) for k in node.keywords if k.arg is not None}
        except NotPlain as exc:
            return await self._opaque(exc, (*node.args, *(k.value for k in node.keywords)), node, local)
        return func(*args, **kwargs)

    async def _sort_by_probed_key(
        self, call: ast.Call, key: ast.expr, items: list[Any], local: dict[str, Any]
    ) -> None:
        """`xs.sort(key=f)` on a list of the tests' with a key of the solution's: the keys are its
        answers (one probe, `[f(v) for v in xs]`), the sort is done here, stable as Python's (it ran
        on a copy in the sandbox: a correct `f` scored 0)."""
        assert isinstance(call.func, ast.Attribute)
        if call.args or {k.arg for k in call.keywords} - {"key", "reverse"}:
            raise CaseFailed("list.sort() takes only key= and reverse=")
        reverse = [await self._eval(k.value, local) for k in call.keywords if k.arg == "reverse"]
        probe = ast.ListComp(
            elt=ast.Call(func=key, args=[ast.Name(_SORT_ITEM, ast.Load())], keywords=[]),
            generators=[
                ast.comprehension(ast.Name(_SORT_ITEM, ast.Store()), call.func.value, [], is_async=0)
            ],
        )
        keys = await self._probe(probe, local)
        if type(keys) is not list or len(keys) != len(items):
            raise CaseFailed("the sort key's answers do not match the list")
        order = sorted(range(len(items)), key=keys.__getitem__, reverse=bool(reverse and reverse[0]))
        items[:] = [items[i] for i in order]

    async def _iterate(self, node: ast.expr, local: dict[str, Any]) -> list[Any]:
        items = []
        for item in _as_iterable(await self._eval(node, local)):
            self._step()
            items.append(item)
        return items

    async def _generate(
        self, node: ast.GeneratorExp | ast.ListComp | ast.SetComp, local: dict[str, Any]
    ) -> Any:
        async for scope in self._scopes(node.generators, 0, dict(local)):
            yield await self._eval(node.elt, scope)

    async def _scopes(self, gens: list[ast.comprehension], i: int, scope: dict[str, Any]) -> Any:
        if i == len(gens):
            yield scope
            return
        gen = gens[i]
        for item in await self._iterate(gen.iter, scope):
            inner = dict(scope)
            _bind(gen.target, item, inner)
            if all([await self._truth(cond, inner) for cond in gen.ifs]):
                async for deeper in self._scopes(gens, i + 1, inner):
                    yield deeper

    async def _comprehension(self, node: ast.expr, local: dict[str, Any]) -> Any:
        if isinstance(node, ast.DictComp):
            pairs = []
            async for scope in self._scopes(node.generators, 0, dict(local)):
                pairs.append((await self._eval(node.key, scope), await self._eval(node.value, scope)))
            check_hashes(k for k, _ in pairs)
            return dict(pairs)
        assert isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp))
        items = [item async for item in self._generate(node, local)]
        if isinstance(node, ast.SetComp):
            check_hashes(items)
            return set(items)
        return items

    async def _call_helper(self, helper: _Helper, call: ast.Call, local: dict[str, Any]) -> Any:
        """Interpret a function the tests define (its asserts must run here). An argument this
        side can compute is passed as a value; any other (the solution's function, say) as a
        `_Ref`, whose source is put in place of the parameter in every probe that names it."""
        fn = helper.node
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        given: dict[str, ast.expr] = dict(zip(params, call.args, strict=False))
        given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
        if len(call.args) > len(params) or set(given) - set(params):
            raise CaseFailed(f"{fn.name}() called with arguments it does not take")
        defaults = dict(zip(params[len(params) - len(fn.args.defaults) :], fn.args.defaults, strict=True))
        scope: dict[str, Any] = {_HELPER_SCOPE: fn.name}
        for param in params:
            if param in given:
                value = await self._eval_here(given[param], local)
                scope[param] = _Ref(given[param], local) if value is _UNRESOLVED else value
            elif param in defaults:
                scope[param] = await self._eval(defaults[param], {})
            else:
                raise CaseFailed(f"{fn.name}() missing argument {param!r}")
        self.depth += 1
        if self.depth > MAX_HELPER_DEPTH:
            raise CaseFailed(f"helpers nested deeper than {MAX_HELPER_DEPTH}")
        try:
            await self._block(fn.body, scope)
        except _Return as ret:
            return ret.value
        finally:
            self.depth -= 1
        return None

    def _for_child(self, node: ast.AST, local: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """`node`'s source as the sandbox gets it (names bound to `_Ref`s replaced by their source)
        and the values it needs from here (encoded), refusing a name that would mean two things."""
        binds: dict[str, Any] = {}

        def expand(tree: ast.AST, scope: dict[str, Any], depth: int) -> ast.AST:
            checker = self

            class Substitute(ast.NodeTransformer):
                def visit_Name(self, name: ast.Name) -> ast.AST:
                    value = checker._resolve(name.id, scope)
                    if isinstance(value, _Ref):
                        if depth > MAX_HELPER_DEPTH:
                            raise CaseFailed("arguments passed through too many helpers")
                        return expand(copy.deepcopy(value.node), value.local, depth + 1)
                    if value is _UNRESOLVED or value is SAFE_FUNCS.get(name.id) or name.id == _HELPER_SCOPE:
                        return name
                    if isinstance(value, (_Module, _Helper)) or callable(value):
                        return name
                    encoded = encode(value)
                    if binds.setdefault(name.id, encoded) != encoded:
                        raise CaseFailed(f"unverifiable test: {name.id!r} means two things in one probe")
                    return name

            result: ast.AST = Substitute().visit(tree)
            return result

        tree = expand(copy.deepcopy(node), local, 0)
        return ast.unparse(tree), binds

    async def _probe(self, node: ast.expr, local: dict[str, Any]) -> Any:
        if self.no_probes:
            raise _NeedsProbe
        self._step()
        try:
            return await self.child.eval(*self._for_child(node, local))
        except NotPlain as exc:
            exc.node = node
            raise


@dataclass(frozen=True)
class _Helper:
    """A function the tests define whose asserts must run here (see `Checker._call_helper`)."""

    node: ast.FunctionDef


@dataclass(frozen=True)
class _Ref:
    """A helper's parameter bound to an argument that lives in the sandbox: its expression and
    the scope it was written in."""

    node: ast.expr
    local: dict[str, Any]


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


def _helper_ok(fn: ast.FunctionDef) -> bool:
    """Simple enough to interpret here: plain parameters, no decorators, no nested scopes that
    would run its asserts in the sandbox, no generators or global/nonlocal."""
    args = fn.args
    if fn.decorator_list or args.vararg or args.kwarg or args.kwonlyargs:
        return False
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Yield, ast.YieldFrom, ast.Global)
    return not any(isinstance(n, (*nested, ast.Nonlocal)) for stmt in fn.body for n in ast.walk(stmt))


_INTERPRETED = (ast.Assert, ast.Pass, ast.Return, ast.Assign, ast.AugAssign, ast.If, ast.For)


def _interpretable(fn: ast.FunctionDef) -> bool:
    """`fn` computes its value only through what `Checker` interprets here with the same result as
    Python: every statement is an assignment to a name, `+=`, `if`, `for`, `return`, `assert` or
    `pass` (no `while`, `try`, `with`, no call made for its side effect), no method is called (a
    method may mutate what it is called on: `out.append(x)` would change a copy in the sandbox,
    and a helper building its cases that way would return none), and `fn` never names itself."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == fn.name:
            return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and owner.id in TRUSTED_MODULES):
                return False
        if isinstance(node, ast.stmt) and node is not fn:
            if not isinstance(node, _INTERPRETED):
                return False
            if isinstance(node, ast.For) and (node.orelse or _target_names(node.target) is None):
                return False
            if isinstance(node, ast.Assign) and (
                len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name)
            ):
                return False
            if isinstance(node, ast.AugAssign) and not isinstance(node.target, ast.Name):
                return False
    return True


class _Unresolved:
    pass


class _NeedsProbe(Exception):
    pass


_UNRESOLVED: Any = _Unresolved()


@dataclass(frozen=True)
class _Module:
    name: str
    table: dict[str, Any]

    def get(self, attr: str) -> Any:
        return self.table[attr] if attr in self.table else _UNRESOLVED


_METHODS: dict[type, frozenset[str]] = {
    list: frozenset("append extend insert pop remove reverse sort index count copy clear".split()),
    dict: frozenset("get keys values items copy pop clear update setdefault".split()),
    set: frozenset("pop remove discard clear copy add update".split()),
    str: frozenset("split rsplit strip lstrip rstrip lower upper startswith endswith splitlines".split()),
}


def _attribute(owner: Any, attr: str) -> Any:
    """`owner.attr` when it runs here: a trusted module's function, or a method of a plain value of
    the tests' (`res.append(f(1))` changes `res` here; it changed a copy in the sandbox, and a
    correct solution scored 0); else _UNRESOLVED."""
    if isinstance(owner, _Module):
        return owner.get(attr)
    if attr not in _METHODS.get(type(owner), ()):
        return _UNRESOLVED
    if attr == "extend":
        return functools.partial(_extend, owner)
    if attr in ("add", "update", "setdefault"):
        return functools.partial(_insert, owner, attr)
    return getattr(owner, attr)


_SORT_ITEM = "_rollmesh_sort_item"
_NONE_FLAG = "_rollmesh_returned_none"


def _is_list_sort(func: Any) -> bool:
    """`func` is `xs.sort` of a list of the tests' (see `_attribute`)."""
    return getattr(func, "__name__", None) == "sort" and type(getattr(func, "__self__", None)) is list


def _extend(items: list[Any], more: Any) -> None:
    more = list(_as_iterable(more))
    if len(items) + len(more) > MAX_LEN:
        raise CaseFailed(f"a list of more than {MAX_LEN} items is too large to check")
    items.extend(more)


def _insert(container: dict[Any, Any] | set[Any], method: str, *args: Any, **kwargs: Any) -> Any:
    """`d.update(...)`, `d.setdefault(k, v)`, `s.add(k)`, `s.update(...)` on a dict or set of the
    tests': the keys may be the solution's answers, so only keys that no answer can make share one
    hash are taken (`_distinct_hashes`); any other fails the case, and the container is bounded
    like every list built here."""
    if isinstance(container, dict) and method == "update":
        if len(args) > 1:
            raise TypeError(f"update expected at most 1 argument, got {len(args)}")
        source = args[0] if args else {}
        pairs = list(source.items()) if isinstance(source, dict) else [tuple(p) for p in _as_iterable(source)]
        if any(len(p) != 2 for p in pairs):
            raise CaseFailed("dict.update() with an item that is not a pair")
        keys = [p[0] for p in pairs] + list(kwargs)
    elif method == "update":
        keys = [k for arg in args for k in _as_iterable(arg)]
    else:
        keys = list(args[:1])
    for key in keys:
        if not _distinct_hashes(key):
            raise CaseFailed(
                f"a {type(key).__name__} key added by .{method}() is not checked (str, int, bool, None are)"
            )
    if len(container) + len(keys) > MAX_LEN:
        raise CaseFailed(f"a container of more than {MAX_LEN} items is too large to check")
    if method != "update":
        return getattr(container, method)(*args, **kwargs)
    if isinstance(container, dict):
        container.update(pairs, **kwargs)
    else:
        container.update(keys)
    return None


_HASH_MODULUS = (1 << 61) - 1  # an int's hash is the int modulo this


def _distinct_hashes(key: Any) -> bool:
    """Distinct keys of these kinds never share a hash (a str's is salted per process): a key an
    answer of the solution's chose cannot be made to collide with many others. A tuple can (its hash
    combines its items' reversibly), and so can a float or a larger int."""
    return key is None or type(key) in (str, bool) or (type(key) is int and abs(key) < _HASH_MODULUS)


def _hash_safe(key: Any) -> bool:
    """A key the tests' own dict can take here at no risk: one of `_distinct_hashes`, or a tuple of
    them. Floats and larger ints can be crafted by the solution to share one hash (quadratic
    inserts on the event loop)."""
    return _distinct_hashes(key) or (type(key) is tuple and all(_hash_safe(k) for k in key))


def _update_in_place(current: Any, value: Any) -> None:
    """A list, dict, set or bytearray the tests passed to the solution in a call made for its effect
    (`rev(x)`) that the call changed there: it changes here too, in place, so every name for it sees
    the change, as in Python. A value of another type stays as it was (no statement can rebind a
    name of the tests from the solution). Only such a call: in `out = f(nums)` then `assert out ==
    sorted(nums)`, `nums` stays the test's, so a solution that rewrites its input cannot set the
    expected value too."""
    if type(current) is not type(value):
        return
    if isinstance(current, (list, bytearray)):
        current[:] = value
    elif isinstance(current, (dict, set)):
        current.clear()
        current.update(value)


def _is_none_check(node: ast.Compare) -> bool:
    """`x is None` / `x is not None`."""
    right = node.comparators[0]
    return (
        len(node.ops) == 1
        and isinstance(node.ops[0], (ast.Is, ast.IsNot))
        and isinstance(right, ast.Constant)
        and right.value is None
    )


def _target_names(target: ast.expr) -> list[str] | None:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        names: list[str] = []
        for elt in target.elts:
            sub = _target_names(elt)
            if sub is None:
                return None
            names += sub
        return names
    return None


def _bind(target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        scope[target.id] = value
        return
    assert isinstance(target, (ast.Tuple, ast.List))
    items = list(_as_iterable(value))
    if len(items) != len(target.elts):
        raise CaseFailed(f"cannot unpack {len(items)} values into {len(target.elts)}")
    for elt, item in zip(target.elts, items, strict=True):
        _bind(elt, item, scope)


def _as_iterable(value: Any) -> Iterable[Any]:
    if isinstance(value, (str, bytes, bytearray, list, tuple, set, frozenset, dict, range)):
        return value
    if isinstance(value, (Iterator, enumerate, zip, deque)):
        return value
    raise CaseFailed(f"a {type(value).__name__} is not iterable")


def normalize_output(text: str) -> list[str]:
    """stdout as compared: surrounding whitespace and each line's trailing whitespace ignored."""
    return [line.rstrip() for line in text.strip().splitlines()]
