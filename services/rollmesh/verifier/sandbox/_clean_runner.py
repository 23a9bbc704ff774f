"""The clean interpreter: the one process where a test's verdict is computed. Copied into its own
sandbox as clean.py next to runner.py, it is loaded once by `runner.py --clean` (a pre-started
process: `_sandbox_runner.fork_server`) and run in a child forked per verify, under the same
limits and guards as the solution's process. It never loads the solution and hears from it only
plain data, decoded strictly by the verifier on the way (`checks.Relay`).

It runs each test case, whole, as Python: expected values, inputs, loop sources, helpers, library
calls and every expression form are computed here, by this interpreter's own builtins and
modules. A name the tests use but never bind is the solution's (as when the tests ran after the
solution in one module). What the solution reports about its globals is data, never a choice of
code run here: a global is an `Opaque` (a name in the solution's process), except a standard
module it imported under its own name (`import math`), which is this interpreter's own import of
what the test names. A global named like a builtin or a standard module (`def pow`, `def bisect`)
is the solution's in a case that tests nothing else of the solution's, and this interpreter's own
in a case that does (`CleanRunner._shadow`): patching `builtins` or `sys.modules` in the solution's
process changes nothing here. A global of the solution's is an `Opaque` here: calling it, or asking its
attributes or what Python would ask of an object (`len`, `str`, `s[0]`, `s + t`, its truth), is
a request to the solution's process with plain-data arguments, answered by plain data or by a
reference to an object of the solution's own. A comparison of such an object is refused (it is
the verdict); its dunders are asked only when the test built it (`Opaque._rm_builds`). A
function of the tests' the solution is given is called back here.

Requests (one JSON line each), answered with frames as `runner.Channel` says:

    setup    {names}                 -> {}                     bind the solution's globals (`load`)
    case     {src}                   -> {"verdict": {ok, asserts, calls, error, unverifiable}}
    callback {fn, args, kwargs}      -> {"value"} | {"raised", "error"}   the solution called a
                                        function of the tests'
    (while a case or callback runs)  -> {"call": {fn, args, kwargs}}, answered by a request
                                        `answer` {value, changed?} | {raised, error} | {abort}

A case passes when it ends without an exception, at least one `assert` ran (or an exception a call
into the solution raised was caught where the test expected one: `_Instrument.visit_Try`), and
every assert that started passed (one whose failure the test caught still fails the case). A case
in which no assert ran and the solution was never called is `unverifiable`: nothing the solution
does can change its outcome. pytest-style `test_*` functions and `Test*` classes
(unittest.TestCase included) that the case defines and never names are called after it, as pytest
would.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import math
import operator
import os
import re
import sys
import types
from collections.abc import Callable
from typing import Any

try:
    from rollmesh.verifier.sandbox import _sandbox_runner as base
except ImportError:  # in the sandbox (python -I -S: the standard library only): runner.py is __main__
    base = sys.modules["__main__"]  # type: ignore[assignment]

_BUILTIN_NAMES = frozenset(dir(builtins))
_UNBOUND: Any = object()
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
_DATA_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__"})  # asked of the solution's process
_EFFECT, _BEGIN, _PASS, _IMPORT = "__rm_effect__", "__rm_begin__", "__rm_pass__", "__rm_import__"
_CAUGHT, _CAUGHT_AS = "__rm_caught__", "__rm_exc__"
_WRAPPER = "Solution"  # LeetCode's wrapper class: what its methods return is a value, not an object to build
_VALUE_OPS = frozenset({"isinstance", "issubclass"})  # asked of a class, not of a returned value


class Refused(BaseException):
    """A comparison of an object of the solution's own: its answer would be the solution's claim."""


class Unverifiable(BaseException):
    """The test needs something that cannot cross to the solution's process as plain data."""


class Aborted(BaseException):
    """The verifier ended the case (too many calls, an undecodable answer): it fails."""


class SolutionError(Exception):
    """The solution raised an exception that is not one of the builtin ones."""


def _exception(name: str, message: str) -> BaseException:
    cls = getattr(builtins, name, None)
    if (
        isinstance(cls, type)
        and issubclass(cls, Exception)
        and not issubclass(cls, (StopIteration, StopAsyncIteration))
    ):
        return cls(message)
    return SolutionError(f"{name}: {message}")


class _Case:
    def __init__(self) -> None:
        self.started = 0
        self.passed = 0
        self.calls = 0
        self.failed = ""  # a refused comparison or an aborted call, caught or not
        self.unverifiable = ""
        self.raised: list[BaseException] = []  # what calls into the solution raised here
        self.decided = 0  # such exceptions a test's except clause caught where it expected them
        self.note = ""  # an object of the solution's own was shown as a placeholder


class CleanRunner:
    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.solution = types.ModuleType("solution")
        self.solution.__getattr__ = lambda name: Opaque(self, ["name", name])  # type: ignore[method-assign]
        sys.modules["solution"] = self.solution
        sys.modules.setdefault("pytest", _PYTEST)
        self.globals: dict[str, Any] = {
            "__name__": "__main__",
            "__builtins__": builtins,
            _EFFECT: self.effect,
            _BEGIN: self.begin,
            _PASS: self.pass_,
            _IMPORT: self.forward_import,
            _CAUGHT: self.caught,
        }
        self.fns: list[Callable[..., Any]] = []
        self.opaque: dict[str, Opaque] = {}  # the solution's globals the tests mention
        self.shadowing: set[str] = set()  # those named like a builtin or a standard module
        self.shadowed: dict[str, Any] = {}  # what `_shadow` bound each to last (`_UNBOUND`: nothing)
        self.case = _Case()
        _ACTIVE.append(self)

    # -- requests -----------------------------------------------------------------------------------

    def handle_safely(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.handle(req)
        except BaseException as exc:
            return {"error": base._short(exc)}

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "setup":
            for name, kind, detail in req["names"]:
                self.bind(str(name), str(kind), detail)
            return {}
        if op == "case":
            return {"verdict": self.run_case(str(req["src"]))}
        if op == "callback":
            try:
                args = [self.decode(a) for a in req["args"]]
                kwargs = {k: self.decode(v) for k, v in req["kwargs"].items()}
                return {"value": self.encode(self.fns[int(req["fn"])](*args, **kwargs))}
            except Exception as exc:
                return {"raised": type(exc).__name__, "error": base._short(exc)}
        raise ValueError(f"unknown request {op!r}")

    def bind(self, name: str, kind: str, detail: Any) -> None:
        """A global of the solution's, as the tests see it (module docstring). What the solution
        reported is data: it decides only between the solution's object (an `Opaque`) and, for a
        standard module it says it imported under that module's own name, this interpreter's
        import of the module the tests name. A name of a builtin or of a standard module that the
        solution defines itself is bound per case (`_shadow`)."""
        if not name.isidentifier() or name.startswith("__"):
            return
        mine = Opaque(self, ["name", name])
        setattr(self.solution, name, mine)  # `import solution; solution.pow(...)`: always its own
        if name in _STDLIB and kind == "module" and detail == name:
            try:
                self.globals[name] = importlib.import_module(name)
            except Exception:  # not importable here (tkinter): the name stays unbound
                pass
            return
        self.opaque[name] = mine
        if name in _BUILTIN_NAMES or name in _STDLIB:
            self.shadowing.add(name)
        else:
            self.globals[name] = mine

    def _shadow(self, tree: ast.Module) -> None:
        """Bind, for one case, the solution's globals named like a builtin or a standard module
        (`def pow`, `def bisect`): the solution's own, as in one interpreter, when the case tests
        nothing else of the solution's (every other name of the solution's it uses is one it binds
        itself, or none); else this interpreter's builtin or module, since the case tests another
        name of the solution's and computes what it expects with the builtin (`assert square(3) ==
        pow(3, 2)`). A name the tests bound themselves is left as they bound it."""
        mentioned, assigned = _names_of(tree)
        subjects = any(
            self.globals.get(name) is self.opaque[name]
            for name in mentioned - assigned - self.shadowing
            if name in self.opaque
        )
        for name in self.shadowing & mentioned:
            current = self.globals.get(name, _UNBOUND)
            if current is not self.shadowed.get(name, _UNBOUND):
                continue  # the tests bound it
            value: Any = _UNBOUND
            if not subjects:
                value = self.opaque[name]
            elif name in _STDLIB and name not in _BUILTIN_NAMES:
                try:
                    value = importlib.import_module(name)
                except Exception:
                    value = _UNBOUND
            if value is _UNBOUND:
                self.globals.pop(name, None)
            else:
                self.globals[name] = value
            self.shadowed[name] = value

    # -- a case -------------------------------------------------------------------------------------

    def run_case(self, src: str) -> dict[str, Any]:
        self.case = case = _Case()
        error = ""
        try:
            tree = ast.parse(src, "test", "exec")
            if self.shadowing:
                self._shadow(tree)
            exec(compile(_instrument(tree), "test", "exec"), self.globals)
            for run in _pytest_style(tree, self.globals):
                run()
        except SystemExit as exc:
            if exc.code not in (None, 0, False):
                error = f"SystemExit: {exc.code}"
        except BaseException as exc:  # the test's own error, a refused comparison, an abort
            error = base._short(exc)
        ok = not error and not case.failed and not case.unverifiable
        ok = ok and case.started == case.passed and (case.passed > 0 or case.decided > 0)
        unverifiable = case.unverifiable
        if not (error or case.failed or unverifiable) and case.started == 0 and case.calls == 0:
            unverifiable = "no assertion ran and the solution was never called"
        if not ok and not error:
            if case.failed or unverifiable:
                error = case.failed or unverifiable
            elif case.started == 0:
                error = "no assertion ran"
            else:
                error = f"{case.started - case.passed} assertion(s) failed (caught by the test)"
        if not ok and case.note:
            error = f"{error} ({case.note})"
        return {
            "ok": ok,
            "asserts": case.passed,
            "calls": case.calls,
            "error": error,
            "unverifiable": unverifiable,
        }

    def begin(self) -> None:
        self.case.started += 1

    def pass_(self, value: Any) -> bool:
        ok = bool(value)
        if ok:
            self.case.passed += 1
        return ok

    def caught(self, exc: BaseException) -> None:
        """A test's except clause caught `exc` where the test fails unless something raises (an
        assert or a raise follows the call in the `try`, or sits in its `else`): when a call into
        the solution raised it, the case is decided as an assert would decide it."""
        if any(exc is raised for raised in self.case.raised):
            self.case.decided += 1

    def effect(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        """A call made as a statement (`rev(xs)`): what a call of the solution's changes in place in
        a list, dict, set or bytearray of the tests' changes here too."""
        if isinstance(fn, Opaque):
            return self.ask(fn._rm_target, list(args), kwargs, effect=True, built=fn._rm_builds())
        return fn(*args, **kwargs)

    def forward_import(self, src: str) -> None:
        """A test's top-level import also runs in the solution's process (the tests' imports ran in
        its globals when both shared one module); its outcome there is ignored."""
        self.ask(["op", "import"], [src], {}, count=False, quiet=True)

    # -- the solution's process ---------------------------------------------------------------------

    def ask(
        self,
        fn: Any,
        args: list[Any],
        kwargs: dict[str, Any],
        *,
        effect: bool = False,
        count: bool = True,
        quiet: bool = False,
        built: bool = False,
    ) -> Any:
        """Call into the solution's process through the verifier; meanwhile answer its callbacks.
        An object of the solution's own in the answer is `built` when the test built it (`Opaque`)."""
        if count:
            self.case.calls += 1
        call = {
            "fn": fn,
            "args": [self.encode(a) for a in args],
            "kwargs": {str(k): self.encode(v) for k, v in kwargs.items()},
        }
        self.channel.reply({"call": call})
        while (msg := self.channel.read()) is not None:
            if msg["op"] == "answer":
                break
            self.channel.reply(self.handle_safely(msg))
        else:
            os._exit(0)
        if "abort" in msg:
            self.case.failed = f"not checked: {msg['abort']}"
            raise Aborted(self.case.failed)
        if "raised" in msg:
            if quiet:
                return None
            exc = _exception(str(msg["raised"]), str(msg.get("error", "")))
            self.case.raised.append(exc)
            raise exc
        value = self.decode(msg["value"], built=built)
        if value is None or effect:
            for key, new in msg.get("changed", ()):
                _update_in_place(args[key] if type(key) is int else kwargs[key], self.decode(new))
        return value

    def decode(self, obj: Any, *, built: bool = False) -> Any:
        return base.decode_loose(obj, lambda tag, body: Opaque(self, ["ref", int(body)], built))

    def encode(self, value: Any) -> Any:
        def other(obj: Any) -> Any:
            if isinstance(obj, Opaque):
                return obj._rm_target
            name = getattr(obj, "__name__", None)
            if type(name) is str and getattr(builtins, name, None) is obj:
                return ["builtin", name]  # `int`, `len`: the solution's process has its own
            if callable(obj):
                self.fns.append(obj)
                return ["fn", len(self.fns) - 1]
            self.case.unverifiable = (
                f"unverifiable test: a {type(obj).__name__} cannot be passed to the solution"
            )
            raise Unverifiable(self.case.unverifiable)

        return base.encode(value, 0, other)

    def placeholder(self, what: str, ref: Opaque) -> str:
        """What `str`/`repr`/`format` show of an object of the solution's own the test did not
        build: never the solution's answer (`str(f(3)) == '6'` is not its claim), but a `print`
        of it still runs."""
        self.case.note = f"the solution returned an object of its own where a value was expected ({what})"
        return f"<an object of the solution's own #{ref._rm_target[1]}>"

    def refuse(self, what: str) -> Refused:
        self.case.failed = f"{what} of an object of the solution's own is not checked (compare plain data)"
        return Refused(self.case.failed)


def _pytest() -> types.ModuleType:
    """What tests use of pytest, when it is not installed here: `raises` (an assert that the block
    raises) and `approx` (numbers, and lists or tuples of them, within a tolerance). Built once,
    before the clean interpreter forks; it counts asserts for the child's runner (`_ACTIVE`)."""
    module = types.ModuleType("pytest")

    class Raises:
        def __init__(self, expected: Any, *, match: str | None = None) -> None:
            self.expected, self.match = expected, match

        def __enter__(self) -> Raises:
            _ACTIVE[-1].begin()
            return self

        def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
            if exc is None:
                raise AssertionError(f"DID NOT RAISE {self.expected}")
            if not isinstance(exc, self.expected) or isinstance(exc, (Refused, Aborted, Unverifiable)):
                return False
            if self.match is not None and not re.search(self.match, str(exc)):
                return False
            return _ACTIVE[-1].pass_(True)

    class Approx:
        def __init__(self, expected: Any, rel: float | None = None, abs: float | None = None) -> None:
            self.expected, self.rel, self.abs = expected, 1e-6 if rel is None else rel, abs or 1e-12

        def close(self, want: Any, got: Any) -> bool:
            if isinstance(want, (list, tuple)):
                return type(got) is type(want) and len(got) == len(want) and all(map(self.close, want, got))
            numbers = (int, float)
            if type(got) not in numbers or type(want) not in numbers:
                return bool(type(got) is type(want) and got == want)
            return math.isclose(got, want, rel_tol=self.rel, abs_tol=self.abs)

        def __eq__(self, other: object) -> bool:
            return self.close(self.expected, other)

        def __ne__(self, other: object) -> bool:
            return not self.close(self.expected, other)

        __hash__ = None  # type: ignore[assignment]

        def __repr__(self) -> str:
            return f"approx({self.expected!r})"

    def fail(reason: str = "", pytrace: bool = True) -> None:
        raise AssertionError(reason)

    module.raises = Raises  # type: ignore[attr-defined]
    module.approx = Approx  # type: ignore[attr-defined]
    module.fail = fail  # type: ignore[attr-defined]
    return module


def _names_of(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The names a case mentions, and those it binds itself (assigns, defines, imports, takes as
    an argument or an exception)."""
    mentioned: set[str] = set()
    assigned: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            mentioned.add(node.id)
            if not isinstance(node.ctx, ast.Load):
                assigned.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            assigned.add(node.name)
        elif isinstance(node, ast.arg):
            assigned.add(node.arg)
        elif isinstance(node, ast.alias):
            assigned.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            assigned.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            assigned.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            assigned.add(node.rest)
    return mentioned, assigned


def _update_in_place(current: Any, value: Any) -> None:
    if type(current) is not type(value):
        return
    if isinstance(current, (list, bytearray)):
        current[:] = value
    elif isinstance(current, (dict, set)):
        current.clear()
        current.update(value)


class _Instrument(ast.NodeTransformer):
    """Counts asserts (`__rm_begin__()` before, `__rm_pass__(test)` inside), marks calls made as
    statements (`f(x)` -> `__rm_effect__(f, x)`), forwards top-level imports to the solution."""

    def __init__(self) -> None:
        self.depth = 0

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt]:
        self.generic_visit(node)
        begin = ast.Expr(ast.Call(ast.Name(_BEGIN, ast.Load()), [], []))
        test = ast.Call(ast.Name(_PASS, ast.Load()), [node.test], [])
        return [begin, ast.Assert(test, node.msg)]

    def visit_Expr(self, node: ast.Expr) -> ast.Expr:
        self.generic_visit(node)
        call = node.value
        if isinstance(call, ast.Call):
            node.value = ast.Call(ast.Name(_EFFECT, ast.Load()), [call.func, *call.args], call.keywords)
        return node

    def _scoped(self, node: ast.AST) -> ast.AST:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped  # type: ignore[assignment]

    def visit_Try(self, node: ast.Try) -> ast.Try:
        """`try: f(); assert False / except E: ...`, `try: f() / except E: ... / else: assert
        False` and `try: f() / except E: return / raise AssertionError` expect `f` to raise: each
        handler that says so tells the runner what it caught (`caught`)."""
        handlers = node.handlers
        if not any(_expects_raise(stmt) for stmt in [*node.body, *node.orelse]):
            handlers = [h for h in handlers if getattr(h, _LEAVES, False)]
        self.generic_visit(node)
        for handler in handlers:
            handler.name = handler.name or _CAUGHT_AS
            tell = ast.Call(ast.Name(_CAUGHT, ast.Load()), [ast.Name(handler.name, ast.Load())], [])
            handler.body.insert(0, ast.Expr(tell))
        return node

    def _import(self, node: ast.Import | ast.ImportFrom) -> Any:
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if self.depth or any(m.split(".")[0] == "solution" for m in modules):
            return node
        forward = ast.Call(ast.Name(_IMPORT, ast.Load()), [ast.Constant(ast.unparse(node))], [])
        return [node, ast.Expr(forward)]

    visit_Import = visit_ImportFrom = _import


_LEAVES = "_rm_leaves_to_skip_a_failure"


def _mark_leaving_handlers(tree: ast.Module) -> None:
    """Marks each handler that leaves its block (`return`, `continue`, `break`) past a statement
    that always fails (`raise ...`, `assert False`, `self.fail(...)`) later in that block."""
    for node in ast.walk(tree):
        for _, block in ast.iter_fields(node):
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if isinstance(stmt, ast.Try) and any(_always_fails(s) for s in block[i + 1 :]):
                    for handler in stmt.handlers:
                        if handler.body and isinstance(
                            handler.body[-1], (ast.Return, ast.Continue, ast.Break)
                        ):
                            setattr(handler, _LEAVES, True)


def _always_fails(stmt: Any) -> bool:
    if isinstance(stmt, ast.Raise):
        return True
    if isinstance(stmt, ast.Assert):
        return isinstance(stmt.test, ast.Constant) and not stmt.test.value
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "fail"


def _expects_raise(stmt: ast.stmt) -> bool:
    """An assert or a raise (`self.fail(...)`, `pytest.fail(...)`) outside nested definitions."""
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Assert, ast.Raise)):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fail":
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _instrument(tree: ast.Module) -> ast.Module:
    _mark_leaving_handlers(tree)
    out = _Instrument().visit(tree)
    assert isinstance(out, ast.Module)
    return ast.fix_missing_locations(out)


def _pytest_style(tree: ast.Module, scope: dict[str, Any]) -> list[Callable[[], Any]]:
    """What pytest would run of the case: its top-level `test*` functions and `Test*` classes'
    `test*` methods, unless the case itself names them (then it calls them)."""
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    runs: list[Callable[[], Any]] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name.startswith("test") and stmt.name not in named:
            fn = scope.get(stmt.name)
            if callable(fn) and not stmt.args.args and not stmt.args.posonlyargs:
                runs.append(fn)
        elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test") and stmt.name not in named:
            cls = scope.get(stmt.name)
            if isinstance(cls, type):
                runs += _test_methods(cls)
    return runs


def _test_methods(cls: type) -> list[Callable[[], Any]]:
    unittest = sys.modules.get("unittest")
    testcase = getattr(unittest, "TestCase", None) if unittest else None
    names = [n for n in dir(cls) if n.startswith("test") and callable(getattr(cls, n))]
    if testcase is not None and issubclass(cls, testcase):
        _count_unittest_asserts(testcase)

        def method(name: str) -> Callable[[], Any]:
            def run() -> None:
                case = cls(name)
                case.setUp()
                try:
                    getattr(case, name)()
                finally:
                    case.tearDown()

            return run

        return [method(n) for n in names]
    return [getattr(cls(), n) for n in names]


def _count_unittest_asserts(testcase: type) -> None:
    """`self.assertEqual(...)` counts as an assert, as the statement does."""
    if getattr(testcase, "_rm_counted", False):
        return
    for name in dir(testcase):
        if name.startswith("assert") and not name.startswith("assert_") and callable(getattr(testcase, name)):
            setattr(testcase, name, _counted(getattr(testcase, name)))
    testcase._rm_counted = True  # type: ignore[attr-defined]


_ACTIVE: list[CleanRunner] = []
_PYTEST = _pytest()


def _counted(method: Callable[..., Any]) -> Callable[..., Any]:
    def assert_method(*args: Any, **kwargs: Any) -> Any:
        runner = _ACTIVE[-1] if _ACTIVE else None
        if runner is not None:
            runner.begin()
        result = method(*args, **kwargs)
        if runner is not None:
            runner.pass_(True)
        return result

    return assert_method


def _comparison(op: Callable[[Any, Any], Any]) -> Callable[[Opaque, Any], Any]:
    """An `Opaque` comparison dunder: `op` on plain values only (`Opaque._rm_compare`)."""

    def compare(self: Opaque, other: Any) -> Any:
        return self._rm_compare(op, other)

    return compare


class Opaque:
    """A global of the solution's (`["name", n]`) or an object of its own (`["ref", n]`), living in
    the solution's process. What Python would ask of it is asked there; a global that turns out to
    be plain data (`MOD = 10**9 + 7`) is fetched and used as data here."""

    __slots__ = ("_rm_built", "_rm_runner", "_rm_target")
    _rm_runner: CleanRunner
    _rm_target: list[Any]
    _rm_built: bool

    def __init__(self, runner: CleanRunner, target: list[Any], built: bool = False) -> None:
        object.__setattr__(self, "_rm_runner", runner)
        object.__setattr__(self, "_rm_target", target)
        object.__setattr__(self, "_rm_built", built)

    def _rm_builds(self) -> bool:
        """Whether what calling this returns is an object the test built: calling a class of the
        solution's (a global named in CapWords, as PEP 8 names classes; not LeetCode's `Solution`
        wrapper), or a method of an object the test built."""
        kind, name = self._rm_target
        if kind == "name":
            return type(name) is str and name[:1].isupper() and name != _WRAPPER
        return self._rm_built

    def _rm_valued(self, name: str, value: Any) -> Any:
        """`value`, unless it is an object of the solution's own the test did not build: then a
        dunder's answer would be the solution's claim where the test expects a value."""
        if isinstance(value, Opaque) and not value._rm_built and name not in _VALUE_OPS:
            raise value._rm_refuse(name)
        return value

    def _rm_refuse(self, name: str) -> Refused:
        case = self._rm_runner.case
        case.failed = f"the solution returned an object of its own where a value was expected ({name})"
        return Refused(case.failed)

    def _rm_value(self) -> Any:
        """Itself, or the plain value a global of the solution's holds."""
        if self._rm_target[0] != "name":
            return self
        return self._rm_runner.ask(["op", "get"], [self], {})

    def _rm_op(self, name: str, local: Callable[..., Any], *args: Any) -> Any:
        value = self._rm_valued(name, self._rm_value())
        if not isinstance(value, Opaque):
            return local(value, *args)
        return self._rm_runner.ask(["op", name], [value, *args], {}, built=value._rm_built)

    def _rm_rop(self, name: str, local: Callable[..., Any], other: Any) -> Any:
        value = self._rm_valued(name, self._rm_value())
        if not isinstance(value, Opaque):
            return local(other, value)
        return self._rm_runner.ask(["op", name], [other, value], {}, built=value._rm_built)

    def _rm_shown(self, name: str, local: Callable[..., Any], *args: Any) -> str:
        value = self._rm_value()
        if isinstance(value, Opaque) and not value._rm_built:
            return self._rm_runner.placeholder(name, value)
        return str(self._rm_typed(name, local, str, *args))

    def _rm_typed(self, name: str, local: Callable[..., Any], kind: type, *args: Any) -> Any:
        value = self._rm_op(name, local, *args)
        if type(value) is not kind:
            raise TypeError(f"{name}() of an object of the solution's returned a {type(value).__name__}")
        return value

    def _rm_compare(self, op: Callable[[Any, Any], Any], other: Any) -> Any:
        value = self._rm_value()
        if isinstance(other, Opaque):
            other = other._rm_value()
        if isinstance(value, Opaque) or isinstance(other, Opaque):
            raise self._rm_runner.refuse("a comparison")
        return op(value, other)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        return self._rm_runner.ask(self._rm_target, list(args), kwargs, built=self._rm_builds())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in _DATA_DUNDERS:
            raise AttributeError(name)
        return self._rm_runner.ask(["op", "getattr"], [self, name], {}, built=self._rm_built)

    def __setattr__(self, name: str, value: Any) -> None:
        self._rm_runner.ask(["op", "setattr"], [self, name, value], {})

    def __delattr__(self, name: str) -> None:
        self._rm_runner.ask(["op", "delattr"], [self, name], {})

    def __hash__(self) -> int:
        return id(self)

    __eq__ = _comparison(operator.eq)
    __ne__ = _comparison(operator.ne)
    __lt__ = _comparison(operator.lt)
    __le__ = _comparison(operator.le)
    __gt__ = _comparison(operator.gt)
    __ge__ = _comparison(operator.ge)

    def __bool__(self) -> bool:
        value = self._rm_value()
        if not isinstance(value, Opaque) or value._rm_built:
            return bool(self._rm_typed("bool", bool, bool))
        # Not built by the test: true, as any object is by default (`while node:`); one that says
        # it is false would be the solution's claim (`assert not is_prime(8)`).
        if self._rm_runner.ask(["op", "bool"], [value], {}) is not True:
            raise value._rm_refuse("bool")
        return True

    def __len__(self) -> int:
        return int(self._rm_typed("len", len, int))

    def __str__(self) -> str:
        return self._rm_shown("str", str)

    def __repr__(self) -> str:
        return self._rm_shown("repr", repr)

    def __format__(self, spec: str) -> str:
        return self._rm_shown("format", format, spec)

    def __int__(self) -> int:
        return int(self._rm_typed("int", int, int))

    def __float__(self) -> float:
        return float(self._rm_typed("float", float, float))

    def __index__(self) -> int:
        return int(self._rm_typed("index", operator.index, int))

    def __iter__(self) -> Any:
        return iter(self._rm_op("iter", lambda v: list(v)))

    def __contains__(self, item: Any) -> bool:
        return bool(self._rm_typed("contains", operator.contains, bool, item))

    def __getitem__(self, key: Any) -> Any:
        return self._rm_op("getitem", operator.getitem, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._rm_op("setitem", operator.setitem, key, value)

    def __delitem__(self, key: Any) -> None:
        self._rm_op("delitem", operator.delitem, key)

    def __instancecheck__(self, obj: Any) -> bool:
        return bool(self._rm_rop("isinstance", isinstance, obj) is True)

    def __subclasscheck__(self, cls: Any) -> bool:
        return bool(self._rm_rop("issubclass", issubclass, cls) is True)

    def __abs__(self) -> Any:
        return self._rm_op("abs", abs)

    def __neg__(self) -> Any:
        return self._rm_op("neg", operator.neg)

    def __pos__(self) -> Any:
        return self._rm_op("pos", operator.pos)

    def __invert__(self) -> Any:
        return self._rm_op("invert", operator.invert)

    def __round__(self, *nd: Any) -> Any:
        return self._rm_op("round", round, *nd)


def _binary(name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    local = getattr(operator, name)

    def forward(self: Opaque, other: Any) -> Any:
        return self._rm_op(name, local, other)

    def reflected(self: Opaque, other: Any) -> Any:
        return self._rm_rop(name, local, other)

    return forward, reflected


for _op in "add sub mul matmul truediv floordiv mod pow lshift rshift and_ or_ xor".split():
    _dunder = _op.rstrip("_")
    _fwd, _ref = _binary(_op)
    setattr(Opaque, f"__{_dunder}__", _fwd)
    setattr(Opaque, f"__r{_dunder}__", _ref)
