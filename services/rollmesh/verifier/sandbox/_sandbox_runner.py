"""The sandboxed side of a run. Copied into the run's temp dir and started as
`python -I -S -B runner.py [--clean] [--keeper]` with an empty environment; the service imports it
only for `encode`. `--keeper` (`process` mode): see `keep`. `--clean`: this process is the clean
interpreter (`_clean_runner.py`, copied next to it as clean.py), which never sees the solution.

Contract of the solution's process (without `--clean`): it never holds a test, an expected value
or a comparison. It answers requests, one JSON object per line on stdin, with frames on the reply
fd (4-byte big-endian length, then a JSON object whose "id" is the latest request's):

    hello {reply_fd, limits, guards, drop_to} -> {}     uid dropped (`process` mode as root),
                                                         rlimits (soft = hard) and guards set
    load  {code, mode}          -> {"names": [...]}      "asserts": run the code once as module
                                                         `solution`, list its globals; "io": compile
    call  {fn, args, kwargs}    -> {"value": v, "changed"?: [[arg, v]...]} | {"raised", "error"}
                                   a function of the solution's (or an `OPS` question about an
                                   object of its own) called with plain-data arguments; a value
                                   that is not plain data goes back as ["ref", n]
                                -> {"callback": {fn, args, kwargs}}  the solution called a function
                                   of the tests'; the answer comes as a request `returned`
                                   {value} | {raised, error}
    main  {stdin}               -> {"stdout", "exit", "truncated"}  one run as `python solution.py
                                   < input` does it

A failure answers {"error": "..."}. Everything sent back is a claim that the verifier decodes
strictly; the solution can rewrite this file's functions, but then all it can do is claim other
values. Before the solution runs, fd 0 becomes /dev/null; stdout and stderr are the service's
diagnostics only, never read for a verdict (a `main` run has fds 0 and 1 of its own:
`Runner.main`). The guards (no sockets, no new processes, no files outside the cwd) are a second
line of defence; the kernel (namespaces, chroot, uid, rlimits) is the first."""

from __future__ import annotations

import builtins
import collections
import decimal
import fractions
import gc
import io
import json
import math
import operator
import os
import resource
import signal
import struct
import sys
import types
from typing import Any
from typing import NoReturn

MAX_ERROR_CHARS = 300
SPECIAL_TAGS = frozenset({"ref", "name", "fn", "builtin"})
MAX_DEPTH = 64
MAX_ITEMS = 100_000
STDOUT_CAP = 1024 * 1024


# -- values as plain data ------------------------------------------------------------------------------


def encode(value: Any, depth: int = 0, other: Any = None) -> Any:
    """A value as JSON-able plain data: null, bool, int (as a JSON number while exact), finite float,
    str; everything else a [tag, payload] pair, the common result types with their type kept
    (namedtuple, range, Counter, OrderedDict, defaultdict, dict views, iterators: consumed into
    their items). `other(value)`, when given, encodes what is not plain data (a reference), else
    TypeError."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if value is None or isinstance(value, bool):
        return bool(value) if value is not None else None
    if isinstance(value, int):
        number = int.__index__(value)
        return number if abs(number) < 1 << 53 else ["int", format(number, "x")]
    if isinstance(value, float):
        real = float.__float__(value)
        return real if math.isfinite(real) else ["float", repr(real)]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, complex):
        return ["complex", [encode(value.real), encode(value.imag)]]
    if isinstance(value, (bytes, bytearray)):
        return ["bytes" if isinstance(value, bytes) else "bytearray", bytes(value).hex()]
    if isinstance(value, fractions.Fraction):
        return ["fraction", [encode(value.numerator), encode(value.denominator)]]
    if isinstance(value, decimal.Decimal):
        return ["decimal", decimal.Decimal.__str__(value)]
    if isinstance(value, collections.deque):
        return ["deque", [encode(v, depth + 1, other) for v in _bounded(value)]]
    if isinstance(value, dict):
        items = [
            [encode(k, depth + 1, other), encode(v, depth + 1, other)] for k, v in _bounded(value.items())
        ]
        if isinstance(value, collections.Counter):
            return ["counter", items]
        if isinstance(value, collections.OrderedDict):
            return ["ordereddict", items]
        if isinstance(value, collections.defaultdict):
            return ["defaultdict", [_factory(value.default_factory, other), items]]
        return ["dict", items]
    if isinstance(value, tuple) and type(value) is not tuple and (fields := _fields(value)) is not None:
        body = [encode(v, depth + 1, other) for v in _bounded(tuple.__iter__(value))]
        return ["namedtuple", [type(value).__name__, list(fields), body]]
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            return [kind.__name__, [encode(v, depth + 1, other) for v in _bounded(value)]]
    if isinstance(value, range):
        return ["range", [encode(value.start), encode(value.stop), encode(value.step)]]
    view = _VIEWS.get(type(value))
    if view is not None:
        return [view, [encode(v, depth + 1, other) for v in _bounded(value)]]
    if hasattr(value, "__next__") and hasattr(value, "__iter__"):
        return ["iterator", [encode(v, depth + 1, other) for v in _bounded(value)]]
    if other is not None:
        return other(value)
    raise TypeError(f"a {type(value).__name__} is not plain data (compare ints, floats, str, containers)")


_VIEWS: dict[type, str] = {type({}.keys()): "keys", type({}.values()): "values", type({}.items()): "items"}
FACTORIES = frozenset(
    {
        "int",
        "float",
        "complex",
        "str",
        "bytes",
        "bytearray",
        "list",
        "tuple",
        "dict",
        "set",
        "frozenset",
        "bool",
    }
)
"""A defaultdict's factory that crosses by name; any other crosses as the object it is."""


def _factory(factory: Any, other: Any) -> Any:
    name = getattr(factory, "__name__", None)
    if factory is None:
        return None
    if name in FACTORIES and getattr(builtins, str(name)) is factory:
        return ["builtin", name]
    if other is None:
        raise TypeError("a defaultdict's factory is not plain data")
    return other(factory)


def _fields(value: tuple[Any, ...]) -> tuple[str, ...] | None:
    """A namedtuple's field names (its class's `_fields`, one string per item), else None."""
    fields = getattr(type(value), "_fields", None)
    if type(fields) is tuple and len(fields) == tuple.__len__(value) and all(type(f) is str for f in fields):
        return fields
    return None


_NAMEDTUPLES: dict[tuple[str, tuple[str, ...]], Any] = {}


def _namedtuple(typename: str, fields: tuple[str, ...]) -> Any:
    """A namedtuple class of that name and fields, made once (invalid field names are renamed
    to their position, `_1`, as `rename=True` does)."""
    key = (typename, fields)
    if key not in _NAMEDTUPLES:
        if len(_NAMEDTUPLES) >= 256:
            _NAMEDTUPLES.clear()
        _NAMEDTUPLES[key] = collections.namedtuple(typename, fields, rename=True)  # type: ignore[misc]
    return _NAMEDTUPLES[key]


def _bounded(items: Any) -> list[Any]:
    out = []
    for item in items:
        out.append(item)
        if len(out) > MAX_ITEMS:
            raise ValueError(f"more than {MAX_ITEMS} items")
    return out


_MAPPINGS: dict[str, Any] = {
    "dict": dict,
    "counter": lambda pairs: collections.Counter(dict(pairs)),
    "ordereddict": collections.OrderedDict,
}
_UNPACKED: dict[str, Any] = {
    "keys": lambda items: dict.fromkeys(items).keys(),
    "values": lambda items: dict(enumerate(items)).values(),
    "items": lambda items: dict(items).items(),
    "iterator": iter,
}


def decode_loose(obj: Any, special: Any = None) -> Any:
    """The inverse of `encode`, for values the verifier sends (trusted, so not strict). `special(tag,
    body)` decodes the tags `encode`'s `other` wrote (references)."""
    if not isinstance(obj, list):
        return obj
    tag, body = obj
    if special is not None and tag in SPECIAL_TAGS:
        return special(tag, body)
    if tag == "int":
        return int(body, 16)
    if tag == "float":  # one NaN object, as `math.nan`: `[f()] == [math.nan]` compares identity first
        return math.nan if body == "nan" else float(body)
    if tag == "complex":
        return complex(decode_loose(body[0]), decode_loose(body[1]))
    if tag in ("bytes", "bytearray"):
        return bytes.fromhex(body) if tag == "bytes" else bytearray.fromhex(body)
    if tag == "fraction":
        return fractions.Fraction(decode_loose(body[0]), decode_loose(body[1]))
    if tag == "decimal":
        return decimal.Decimal(body)
    if tag in _MAPPINGS:
        pairs = [(decode_loose(k, special), decode_loose(v, special)) for k, v in body]
        return _MAPPINGS[tag](pairs)
    if tag == "defaultdict":
        factory, pairs = body
        if isinstance(factory, list) and factory[0] == "builtin" and factory[1] in FACTORIES:
            made = getattr(builtins, factory[1])
        else:
            made = decode_loose(factory, special)
        return collections.defaultdict(
            made, [(decode_loose(k, special), decode_loose(v, special)) for k, v in body[1]]
        )
    if tag == "namedtuple":
        typename, fields, items = body
        return _namedtuple(typename, tuple(fields))(*(decode_loose(v, special) for v in items))
    if tag == "range":
        return range(*(decode_loose(v) for v in body))
    if tag in _UNPACKED:
        return _UNPACKED[tag]([decode_loose(v, special) for v in body])
    kinds: dict[str, Any] = {
        "list": list,
        "tuple": tuple,
        "set": set,
        "frozenset": frozenset,
        "deque": collections.deque,
    }
    return kinds[tag](decode_loose(v, special) for v in body)


# -- limits and guards ---------------------------------------------------------------------------------


def _limit(which: int, soft: int, hard: int | None = None) -> None:
    try:
        resource.setrlimit(which, (soft, soft if hard is None else hard))
    except (ValueError, OSError):
        pass


CPU_LIMIT_EXIT = 124
"""The runner's exit status when its CPU-time limit (SIGXCPU) stops it: the verifier reports a
timeout. The code could exit with it too; that only names its failure differently (reward 0)."""


def _on_cpu_limit(signum: int, frame: Any) -> None:
    os._exit(CPU_LIMIT_EXIT)


def _apply_limits(lim: dict[str, int]) -> None:
    signal.signal(signal.SIGXCPU, _on_cpu_limit)  # as pid 1 of a namespace, unhandled it is ignored
    _limit(resource.RLIMIT_CPU, lim["cpu_s"], lim["cpu_s"] + 1)
    _limit(resource.RLIMIT_AS, lim["memory_mb"] * 1024 * 1024)
    _limit(resource.RLIMIT_FSIZE, lim["fsize_mb"] * 1024 * 1024)
    _limit(resource.RLIMIT_NPROC, lim["nproc"])
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_NOFILE, 64)


class _DenyPopen:
    """On sys.meta_path while `subprocess` is not loaded: when it is imported, its `Popen` is
    replaced before the import returns (reloaded too). Importing subprocess up front would load
    `threading`, whose after-fork hook costs every child a pre-started process forks ~0.5 ms."""

    def __init__(self, guards: _Guards) -> None:
        self.guards = guards

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "subprocess":
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _DenyingLoader(spec.loader, self.guards)  # type: ignore[assignment]
        return spec


class _DenyingLoader:
    def __init__(self, inner: Any, guards: _Guards) -> None:
        self.inner = inner
        self.guards = guards

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        module.Popen = self.guards.denied("starting processes", module.Popen)


class _Guards:
    """The guards (no sockets, no new processes, no files outside `workdir`), set in this process
    (`set`) and in force once `armed`. A pre-started process sets them once, before it forks,
    unarmed (its own calls pass through to what they replace), and each child it forks arms them
    with one write: setting them in each child cost it ~90 pages of its parent's heap to copy,
    building them there ~200 more."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.armed = False

    def denied(self, what: str, real: Any, unless: str = "") -> Any:
        """`real`, refused once armed. A class stays a class (a subclass whose instances cannot
        be made, unless given the argument `unless`, as 4th positional or keyword): the standard
        library subclasses `socket.socket` (ssl, which asyncio imports)."""
        guards = self
        if isinstance(real, type):

            def init(obj: Any, *args: Any, **kwargs: Any) -> None:
                given = unless and ((len(args) > 3 and args[3] is not None) or kwargs.get(unless) is not None)
                if guards.armed and not given:
                    raise PermissionError(f"{what} is not allowed in the sandbox")
                real.__init__(obj, *args, **kwargs)  # type: ignore[misc]

            names = {"__init__": init, "__module__": real.__module__, "__qualname__": real.__qualname__}
            return type(real.__name__, (real,), names)

        def deny(*args: Any, **kwargs: Any) -> Any:
            if guards.armed:
                raise PermissionError(f"{what} is not allowed in the sandbox")
            return real(*args, **kwargs)

        return deny

    def set(self) -> None:
        import _posixsubprocess
        import _socket
        import socket

        for target in (socket, _socket):  # a new socket is refused; wrapping an fd (socketpair) is not
            setattr(target, "socket", self.denied("network access", target.socket, unless="fileno"))  # noqa: B010
        for name in ("create_connection", "fromfd"):  # socketpair stays: AF_UNIX only (asyncio's loop)
            setattr(socket, name, self.denied("network access", getattr(socket, name)))
        for name in (
            "fork",
            "forkpty",
            "system",
            "popen",
            "execv",
            "execve",
            "execl",
            "execle",
            "execlp",
            "execvp",
            "execvpe",
            "spawnv",
            "spawnve",
            "spawnl",
            "spawnle",
            "posix_spawn",
            "posix_spawnp",
            "kill",
            "killpg",
        ):
            if hasattr(os, name):
                setattr(os, name, self.denied("starting processes", getattr(os, name)))
        _posixsubprocess.fork_exec = self.denied("starting processes", _posixsubprocess.fork_exec)
        if "subprocess" in sys.modules:
            module = sys.modules["subprocess"]
            module.Popen = self.denied("starting processes", module.Popen)  # type: ignore[attr-defined]
        else:
            sys.meta_path.insert(0, _DenyPopen(self))

        guards, root, allowed_read = self, os.path.realpath(self.workdir), _read_roots()

        def check(path: Any, writing: bool) -> None:
            if not guards.armed or isinstance(path, int):
                return
            real = os.path.realpath(os.fsdecode(path))
            if real == root or real.startswith(root + os.sep):
                return
            if not writing and any(real.startswith(p + os.sep) for p in allowed_read):
                return
            raise PermissionError(f"access to {os.fsdecode(path)!r} is outside the sandbox")

        real_open = builtins.open
        real_os_open = os.open

        def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            check(file, any(c in mode for c in "wax+"))
            return real_open(file, mode, *args, **kwargs)

        def guarded_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            check(path, bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC)))
            return real_os_open(path, flags, *args, **kwargs)

        builtins.open = guarded_open
        io.open = guarded_open
        os.open = guarded_os_open  # type: ignore[assignment]
        for name in (
            "listdir",
            "scandir",
            "remove",
            "unlink",
            "rmdir",
            "rename",
            "replace",
            "mkdir",
            "chdir",
        ):
            fn = getattr(os, name)

            def wrapped(
                path: Any = ".", *args: Any, _fn: Any = fn, _w: bool = name != "listdir", **kw: Any
            ) -> Any:
                check(path, _w and _fn.__name__ not in ("scandir",))
                return _fn(path, *args, **kw)

            setattr(os, name, wrapped)


def _arm_guards(workdir: str) -> None:
    """Put the guards for code whose directory is `workdir` in force: those a pre-started process
    set before it forked (`_prepare_forks`), when they are for that directory, else new ones."""
    guards = _CACHED.get("guards")
    if guards is None or guards.workdir != workdir:
        guards = _Guards(workdir)
        guards.set()
    guards.armed = True


# -- requests ------------------------------------------------------------------------------------------


class _CappedBytes(io.RawIOBase):
    """Under sys.stdout for one `main` run (text and `.buffer` writes): the first STDOUT_CAP bytes kept."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.truncated = False

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        room = STDOUT_CAP - len(self.data)
        chunk = bytes(b)
        if len(chunk) > room:
            self.truncated = True
        self.data += chunk[: max(room, 0)]
        return len(chunk)


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


class Channel:
    """This side of the verifier's channel: requests as JSON lines on the fd `requests`, replies as
    frames on `reply_fd`. Strict alternation: every frame answers the latest request read (`last_id`),
    so a side may ask the verifier something (and read its answer) before it replies.

    Requests are read a chunk at a time (a line read from an unbuffered pipe costs a read(2) per
    byte). The clean interpreter's parent shares the pipe with the child it forks: what it read past
    its "fork" request is the child's, which the child inherits in `pending` (the parent drops it),
    and the verifier writes nothing for the parent until that child has answered its last request."""

    def __init__(self, requests: int, reply_fd: int = -1) -> None:
        self.requests = requests
        self.reply_fd = reply_fd
        self.last_id = -1
        self.pending = b""

    def read(self) -> dict[str, Any] | None:
        while (end := self.pending.find(b"\n")) < 0:
            os.set_blocking(self.requests, True)  # the code may have made it non-blocking
            chunk = os.read(self.requests, 1 << 16)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending[:end], self.pending[end + 1 :]
        req: dict[str, Any] = json.loads(line)
        self.last_id = int(req["id"])
        return req

    def reply(self, body: dict[str, Any]) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        data = json.dumps({"id": self.last_id, **body}).encode()
        frame = struct.pack(">I", len(data)) + data
        while frame:
            frame = frame[os.write(self.reply_fd, frame) :]


OPS: dict[str, Any] = {
    "get": lambda x: x,
    "getattr": getattr,
    "setattr": setattr,
    "delattr": delattr,
    "len": len,
    "str": str,
    "repr": repr,
    "bool": bool,
    "int": int,
    "float": float,
    "index": operator.index,
    "iter": iter,
    "next": next,
    "contains": operator.contains,
    "getitem": operator.getitem,
    "setitem": operator.setitem,
    "delitem": operator.delitem,
    "isinstance": isinstance,
    "issubclass": issubclass,
    "abs": abs,
    "neg": operator.neg,
    "pos": operator.pos,
    "invert": operator.invert,
    "round": round,
    "format": format,
} | {
    name: getattr(operator, name)
    for name in "add sub mul matmul truediv floordiv mod pow lshift rshift and_ or_ xor".split()
}
"""What the verifier may ask about an object of the solution's own (`len(s)`, `s[0]`, `s + t`):
answered by the object's own methods. Comparisons are not here: they are the verdict's."""


_BUILTIN_EXCEPTIONS: dict[str, type] = {
    name: cls
    for name, cls in vars(builtins).items()
    if isinstance(cls, type) and issubclass(cls, BaseException)
}  # taken before any solution is loaded


def _call_error(exc: BaseException) -> dict[str, Any]:
    """The exception as the nearest builtin class it derives from (`class E(ValueError)` crosses
    as ValueError, so `except ValueError` catches it as Python would); its message keeps its name."""
    raised = next(
        (c.__name__ for c in type(exc).__mro__ if _BUILTIN_EXCEPTIONS.get(c.__name__) is c),
        "BaseException",
    )
    return {"raised": raised, "error": _short(exc)}


class Runner:
    """The solution's side: it loads the code as module `solution` and answers calls into it. Every
    argument arrives as plain data or a reference (`ref`: an object of the solution's it sent
    before; `name`: a global of the solution; `fn`: a function of the tests', called back through
    the verifier); every answer goes back as plain data, or as a reference when it is not."""

    def __init__(self, channel: Channel) -> None:
        module = types.ModuleType("solution")
        module.__dict__["__builtins__"] = builtins
        sys.modules["solution"] = module
        self.globals: dict[str, Any] = module.__dict__
        self.code: Any = None
        self.channel = channel
        self.refs: list[Any] = []
        sys.argv = ["solution.py"]  # as `python solution.py` has it (argparse, fileinput)

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "load":
            self.code = compile(req["code"], "solution.py", "exec")
            if req["mode"] == "asserts":
                exec(self.code, self.globals)
                return {"names": self.names()}
            return {}
        if op == "call":
            return self.call(req["fn"], req.get("args", []), req.get("kwargs", {}))
        if op == "main":
            return self.main(str(req["stdin"]))
        raise ValueError(f"unknown request {op!r}")

    def names(self) -> list[list[Any]]:
        """The solution's globals as the tests may name them: a module (by its name) or the
        solution's own. Only a claim: the clean interpreter binds from it nothing but a standard
        module imported under its own name (`_clean_runner.CleanRunner.bind`)."""
        out: list[list[Any]] = []
        for name, value in list(self.globals.items())[:4096]:
            if name.startswith("__") or not isinstance(name, str):
                continue
            try:
                if isinstance(value, types.ModuleType):
                    out.append([name, "module", str(value.__name__)])
                    continue
            except BaseException:
                pass
            out.append([name, "own", None])
        return out

    def resolve(self, tag: str, body: Any) -> Any:
        if tag == "ref":
            return self.refs[int(body)]
        if tag == "name":
            return self.globals[str(body)]
        if tag == "builtin":
            return getattr(builtins, str(body))
        return self.callback(int(body))

    def callback(self, fn: int) -> Any:
        """A function of the tests' (in the clean interpreter): calling it asks the verifier, which
        has the clean interpreter call it; meanwhile this side answers what it is asked."""
        runner = self

        def call_back(*args: Any, **kwargs: Any) -> Any:
            sent = {"fn": fn, "args": [runner.encode(a) for a in args]}
            runner.channel.reply(
                {"callback": {**sent, "kwargs": {k: runner.encode(v) for k, v in kwargs.items()}}}
            )
            while (req := runner.channel.read()) is not None:
                if req["op"] == "returned":
                    if "raised" in req:
                        raise CallbackError(f"{req['raised']}: {req.get('error', '')}")
                    return decode_loose(req["value"], runner.resolve)
                runner.channel.reply(runner.handle_safely(req))
            os._exit(0)

        return call_back

    def handle_safely(self, req: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.handle(req)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: all the code's errors
            return {"error": _short(exc)}

    def encode(self, value: Any) -> Any:
        def ref(obj: Any) -> Any:
            self.refs.append(obj)
            return ["ref", len(self.refs) - 1]

        return encode(value, 0, ref)

    def call(self, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Call `fn` (a reference, or ["op", name] of `OPS`) with the arguments; the answer, and
        the new value of each list, dict, set or bytearray argument the call changed in place."""
        try:
            given = [decode_loose(a, self.resolve) for a in args]
            named = {k: decode_loose(v, self.resolve) for k, v in kwargs.items()}
            if fn == ["op", "import"]:  # a test's import, for code that relied on it (shared globals)
                exec(compile(str(given[0]), "test", "exec"), self.globals)
                return {"value": None}
            target = OPS[fn[1]] if fn[0] == "op" else self.resolve(fn[0], fn[1])
            value = target(*given, **named)
        except BaseException as exc:  # the solution's error, or SystemExit: all the code's
            return _call_error(exc)
        changed = []
        for key, sent, now in [
            *zip(range(len(args)), args, given, strict=True),
            *((k, kwargs[k], named[k]) for k in named),
        ]:
            if isinstance(now, (list, dict, set, bytearray)):
                try:
                    after = self.encode(now)
                except BaseException as exc:
                    return _call_error(exc)
                if json.dumps(after) != json.dumps(sent):
                    changed.append([key, after])
        try:
            body: dict[str, Any] = {"value": self.encode(value)}
        except BaseException as exc:
            return _call_error(exc)
        if changed:
            body["changed"] = changed
        return body

    def main(self, stdin: str) -> dict[str, Any]:
        """One run as `python solution.py < input` does it: the input on a pipe as fd 0, fd 1 a
        file of its own (memfd) read back as the output, `sys.stdin`/`sys.stdout` the
        interpreter's own streams over them (block-buffered, flushed at the end as at exit),
        `sys.argv` ["solution.py"]. `os._exit` ends the run where it is called, nothing
        flushed. Everything is put back before the reply."""
        data = stdin.encode("utf-8", "surrogatepass")
        saved = os.dup(0), os.dup(1)
        sink = os.memfd_create("stdout")
        read_end, write_end = os.pipe()
        fed = _feed(write_end, data)
        os.dup2(read_end, 0)
        os.close(read_end)
        os.dup2(sink, 1)
        kept = {name: getattr(sys, name) for name in _STREAMS}, sys.argv, os._exit
        reader = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding="utf-8")
        writer = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "wb", closefd=False)), encoding="utf-8")
        for name in _STREAMS:
            setattr(sys, name, reader if "in" in name else writer)
        sys.argv = ["solution.py"]
        os._exit = _hard_exit
        scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        code: Any = None
        hard = False
        try:
            try:
                exec(self.code, scope)
            except SystemExit as exc:
                code = exc.code
            except _HardExit as exc:
                code, hard = exc.code, True
            if not hard:
                _flushed(scope)
            size = os.fstat(sink).st_size
            out = os.pread(sink, min(size, STDOUT_CAP), 0)
        finally:
            for name, stream in kept[0].items():
                setattr(sys, name, stream)
            sys.argv, os._exit = kept[1], kept[2]
            os.dup2(saved[0], 0)
            os.dup2(saved[1], 1)
            for fd in (*saved, sink):
                os.close(fd)
            if fed is not None:
                fed.acquire()  # the feeder saw the pipe close; it closed its end
            scope.clear()
        exit_code = code if code is None or isinstance(code, int) else 1
        return {"stdout": out.decode("utf-8", "replace"), "exit": exit_code, "truncated": size > STDOUT_CAP}


class _HardExit(BaseException):
    """`os._exit(n)` during a stdin/stdout run: the run ends there, nothing buffered flushed."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


_STREAMS = ("stdin", "stdout", "__stdin__", "__stdout__")


def _hard_exit(status: int) -> NoReturn:
    raise _HardExit(int(status))


def _flushed(scope: dict[str, Any]) -> None:
    """What the interpreter does at exit: flush `sys.stdout`, then drop the module's globals (a file
    object the program left open, `open(1, "w")`, flushes as it goes)."""
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    try:
        scope.clear()
    except BaseException:
        pass


def _feed(fd: int, data: bytes) -> Any:
    """Write `data` to the pipe's write end `fd` and close it: at once when it fits the pipe (grown
    to up to 1 MiB), else from a thread while the program reads. Returns None, or a lock the thread
    releases once it has closed `fd` (after the program's read end closed, if it stopped reading)."""
    if len(data) <= 4096:  # an empty pipe holds a page at least, whatever the user's pipe budget
        if data:
            os.write(fd, data)
        os.close(fd)
        return None
    import fcntl

    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, min(max(len(data), 4096), 1 << 20))
    except OSError:
        pass
    os.set_blocking(fd, False)
    try:
        sent = os.write(fd, data) if data else 0
    except BlockingIOError:
        sent = 0
    if sent >= len(data):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    import _thread

    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(_feed_rest, (fd, memoryview(data)[sent:], done))
    return done


def _feed_rest(fd: int, rest: memoryview, done: Any) -> None:
    try:
        while rest:
            rest = rest[os.write(fd, rest) :]
    except OSError:  # the program's read end closed (EPIPE: Python ignores SIGPIPE)
        pass
    finally:
        os.close(fd)
        done.release()


class CallbackError(Exception):
    """A function of the tests' that the solution called raised (in the clean interpreter)."""


def main() -> None:
    channel = Channel(os.dup(0))
    hello = channel.read()
    if hello is None:
        os._exit(0)
    channel.reply_fd = os.dup(int(hello["reply_fd"]))
    os.close(int(hello["reply_fd"]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = io.StringIO("")
    if hello.get("drop_to") is not None:
        uid = int(hello["drop_to"])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _no_new_privileges()
    if "--clean" in sys.argv[1:]:
        fork_server(channel)
    _apply_limits(hello["limits"])
    runner = Runner(channel)
    if hello.get("guards", True):
        _arm_guards(os.getcwd())
    channel.reply({})
    del hello
    while (req := channel.read()) is not None:
        channel.reply(runner.handle_safely(req))
    os._exit(0)


def fork_server(channel: Channel) -> None:
    """The clean interpreter, pre-started: a process that only ever runs this file and clean.py,
    with the modules tests use already imported, forks one child per run ("fork" {limits,
    guards} -> {} from the child, which then serves the run until "exit" -> {}, or until it has
    answered a "case" marked "last"). Runs are one at a
    time; after each, every process the child left is killed and the directory emptied, so no run
    sees another's state. A child that ended any other way (a limit, a crash) ends this process
    too, with the child's status: the verifier starts a new one."""
    clean = _load_clean()
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: what a run's child leaves comes back to us
    _prctl(4, 0)  # PR_SET_DUMPABLE 0: a child (same uid) cannot ptrace us or write our memory
    channel.reply({})
    keep = {"runner.py", "clean.py"}
    _warm(clean)
    _prepare_forks(os.getcwd())
    gc.freeze()  # what every child shares with us is never touched by its collections
    while (req := channel.read()) is not None:
        if req["op"] != "fork":
            channel.reply({"error": f"unknown request {req['op']!r}"})
            continue
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(done_r)
            _apply_limits(req["limits"])
            runner = clean.CleanRunner(channel)
            if req.get("guards", True):
                _arm_guards(os.getcwd())
            channel.reply({})
            while (r := channel.read()) is not None:
                if r["op"] == "exit":
                    os.write(done_w, b"x")
                    channel.reply({})
                    break
                reply = runner.handle_safely(r)
                if r["op"] == "case" and r.get("last") is True:  # "exit" with the verdict
                    os.write(done_w, b"x")
                    channel.reply(reply)
                    break
                channel.reply(reply)
            os._exit(0)
        os.close(done_w)
        channel.pending = b""  # the child's requests (`Channel`)
        _, status = os.waitpid(pid, 0)
        finished = os.read(done_r, 1) == b"x"
        os.close(done_r)
        _kill_all_but_me()
        for name in os.listdir("."):
            if name not in keep:
                _remove(name)
        if not finished:
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) and os.WEXITSTATUS(status) else 1)
    os._exit(0)


REPLY_FD = 3
"""The reply fd of a run's process forked by `fork_solutions` (its requests on 0, its output on 1, 2)."""

_MS_NOSUID, _MS_NODEV, _MNT_DETACH, _CLONE_NEWIPC = 2, 4, 2, 0x08000000


def fork_solutions(control_fd: int) -> None:
    """`--solutions=FD` (namespaces mode, as root): the solution's sandbox, pre-started. It stays
    root in its chroot (pid 1 of its namespaces) and only ever runs this file; on the unix socket
    `control_fd` it says {"ready": true} once up, then takes, one run at a time:

        fork {uid, disk_mb} + 4 fds (requests, replies, stdout, stderr)
                                -> {"pid"}      a fresh tmpfs of disk_mb as /sandbox (the run's
                                                 last one unmounted), then a child: the fds on 0, 3,
                                                 1, 2 and nothing else open, its own session and
                                                 IPC namespace (SysV objects outlive processes),
                                                 the run's uid; then a fresh runner (`main`)
        end  {grace_s}          -> {"status"}   after up to grace_s for the child to exit, every
                                                 other process of the namespace SIGKILLed and
                                                 reaped; the child's exit status (-signal if killed)

    The child runs as the run's uid, so the code cannot signal, ptrace or write to this process
    (root, not dumpable); this process never sees a run's code, tests or answers (they travel on
    the child's own pipes), so a child inherits nothing of another run. Any other request ends it."""
    import socket

    if os.getpid() != 1:  # kill(-1) below must only ever reach this namespace
        os._exit(71)
    libc = _libc()
    control = socket.socket(fileno=control_fd)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    _prctl(4, 0)  # PR_SET_DUMPABLE 0
    _no_new_privileges()
    os.chdir("/")
    _warm()
    _prepare_forks("/sandbox")
    gc.freeze()  # what every child shares with us is never touched by its collections
    control.send(json.dumps({"ready": True}).encode())
    mounted, child = False, 0
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, 1 << 16, 4)
            req = json.loads(data) if data else {}
        except (OSError, ValueError):
            os._exit(0)
        op = req.get("op")
        if op == "fork" and not child and len(fds) == 4 and int(req["uid"]) > 0:
            uid = int(req["uid"])
            if mounted and libc.umount2(b"/sandbox", _MNT_DETACH) != 0:
                os._exit(72)
            opts = f"size={int(req['disk_mb'])}m,mode=700".encode()
            if libc.mount(b"sbxwork", b"/sandbox", b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
                os._exit(73)
            mounted = True
            os.chown("/sandbox", uid, uid)
            child = os.fork()
            if child == 0:
                _forked_run(control, fds, uid)
            for fd in fds:
                os.close(fd)
            control.send(json.dumps({"pid": child}).encode())
        elif op == "end" and child:
            status = _end_run(child, float(req.get("grace_s", 0)))
            child = 0
            control.send(json.dumps({"status": status}).encode())
        elif data:
            os._exit(74)
        else:
            os._exit(0)


def _forked_run(control: Any, fds: list[int], uid: int) -> None:
    """The child of `fork_solutions` for one run: only the run's fds, the run's uid, then `main`."""
    try:
        control.close()
        requests, reply, out, err = fds
        for fd, target in ((requests, 0), (out, 1), (err, 2), (reply, REPLY_FD)):
            os.dup2(fd, target)  # each source is >= 3, and sources on 0-2 go first: none is lost
        os.closerange(REPLY_FD + 1, 1 << 16)
        os.setsid()
        if _libc().unshare(_CLONE_NEWIPC) != 0:  # SysV IPC outlives processes
            os._exit(75)
        os.chdir("/sandbox")
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        main()
    finally:
        os._exit(70)


def _end_run(child: int, grace_s: float) -> int | None:
    """Wait up to `grace_s` for `child`, then SIGKILL every other process of this pid namespace and
    reap them all: the child's exit status as Popen's returncode (None if it was never reaped)."""
    import time

    status = None
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        pid, st = os.waitpid(child, os.WNOHANG)
        if pid:
            status = st
            break
        time.sleep(0.01)
    reaped = _kill_and_reap_all(child)
    status = reaped if status is None else status
    if status is None:
        return None
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _load_clean() -> Any:
    """clean.py (next to this file; it uses this module, which runs as `__main__`), with the
    modules tests use most imported once, before any fork."""
    import importlib.util

    for name in ("ast", "collections", "functools", "itertools", "math", "random", "re", "string"):
        __import__(name)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "clean.py")
    spec = importlib.util.spec_from_file_location("clean", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CACHED: dict[str, Any] = {}  # filled by a pre-started process once, before it forks


def _read_roots() -> tuple[str, ...]:
    """Where the guards let the code read: the standard library's directories."""
    if "read_roots" not in _CACHED:
        _CACHED["read_roots"] = tuple(os.path.realpath(p) for p in sys.path if p and os.path.isabs(p))
    roots: tuple[str, ...] = _CACHED["read_roots"]
    return roots


def _libc() -> Any:
    if "libc" not in _CACHED:
        import ctypes

        _CACHED["libc"] = ctypes.CDLL(None, use_errno=True)
    return _CACHED["libc"]


_WARM_CODE = "import math\n\ndef f(a, b=1):\n    return [a, {'b': b}, (a, b), math.pi]\n"
_WARM_TEST = (
    "x = f(1, b=2)\nassert x == [1, {'b': 2}, (1, 2), 3.14], x\nf(0)\n"
    "try:\n    f()\nexcept TypeError:\n    pass\n"
    "for i in range(2):\n    assert f(i) and [y for y in x] != x[:1], f'{i}'\n"
)


def _warm(clean: Any = None) -> None:
    """Run once, here, the code every forked child runs first on each request (decoding, encoding,
    compiling, the clean interpreter's rewriting of a test): Python 3.11 rewrites a function's
    bytecode as it warms up, and a child doing that writes to, and so copies, each page of its
    parent's code it runs. Nothing of a run is here: only code objects warmed and caches filled."""
    args = [encode(a) for a in (1, "a", [2.5, {"k": (1,)}])]
    request = json.loads(json.dumps({"id": 1, "op": "call", "fn": ["ref", 0], "args": args}))
    scope: dict[str, Any] = {"__builtins__": builtins}
    exec(compile(_WARM_CODE, "solution.py", "exec"), scope)
    value = scope["f"](*[decode_loose(a) for a in request["args"]][:2])
    json.dumps({"id": 1, "value": encode(value, 0, lambda obj: ["ref", 0])})
    if clean is not None:
        import ast

        tree = ast.parse(_WARM_TEST, "test", "exec")
        compile(clean._instrument(tree), "test", "exec")
        clean._pytest_style(tree, {})


def _prepare_forks(workdir: str) -> None:
    """What every forked child would work out again, once (a child's first touch of each page of
    the parent's heap costs it a copy: fewer is faster); `workdir`: the children's directory."""
    _read_roots()
    libc = _libc()
    for name in ("prctl", "unshare", "mount", "umount2"):  # each looked up once (dlsym, a new attribute)
        getattr(libc, name)
    guards = _Guards(workdir)
    guards.set()  # unarmed: `_arm_guards`
    _CACHED["guards"] = guards
    gc.collect()
    libc.malloc_trim(0)  # free pages of the heap back to the kernel: fewer to map into each child


def _prctl(option: int, value: int) -> None:
    try:
        _libc().prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_all_but_me() -> None:
    """Every process a run left: as pid 1 of the run's namespace, all others in it; else (`process`
    mode, a subreaper) every descendant."""
    if os.getpid() == 1:
        _kill_and_reap_all()
    else:
        _kill_descendants()


def _kill_and_reap_all(child: int = 0) -> int | None:
    """SIGKILL every other process this one can signal (as pid 1: its whole namespace) and reap all
    its children: the wait status of `child` if it was among them."""
    try:
        os.kill(-1, 9)
    except OSError:
        pass
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if child and pid == child:
            status = st


def _remove(name: str) -> None:
    import shutil

    try:
        if os.path.isdir(name) and not os.path.islink(name):
            shutil.rmtree(name, ignore_errors=True)
        else:
            os.unlink(name)
    except OSError:
        pass


class _Stop(Exception):
    pass


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc/*/stat)."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if len(fields) > 1 and int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def _kill_descendants() -> None:
    """SIGKILL every descendant; as a child subreaper, orphans come back to us until none is left."""
    me = os.getpid()
    while kids := _children(me):
        for kid in kids:
            try:
                os.kill(kid, 9)
            except OSError:
                pass
        for _ in kids:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break


def keep() -> None:
    """`process` mode: be a child subreaper, run the runner in a child, and when it exits or the
    verifier sends SIGTERM, SIGKILL every descendant left (daemons that called setsid included),
    then exit as the runner did. As root we stay root while the runner drops to the run's uid, so the
    code cannot signal us; as non-root it can (that mode promises nothing)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        os._exit(70)

    def stop(signum: int, frame: Any) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        main()
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.closerange(3, 4096)
    status = 0
    try:
        _, status = os.waitpid(pid, 0)
    except _Stop:
        status = 0
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _kill_descendants()
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _no_new_privileges() -> None:
    """PR_SET_NO_NEW_PRIVS: no setuid binary can give the code privileges back (best effort)."""
    try:
        _libc().prctl(38, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _site_builtins() -> None:
    """What `site` adds to the builtins, which `python -S` leaves out: `exit`, `quit` (a program
    may end with them), `help`, `copyright`, `credits`, `license`."""
    import _sitebuiltins

    eof = "Ctrl-D (i.e. EOF)"
    builtins.exit = _sitebuiltins.Quitter("exit", eof)  # type: ignore[attr-defined]
    builtins.quit = _sitebuiltins.Quitter("quit", eof)  # type: ignore[attr-defined]
    builtins.help = _sitebuiltins._Helper()  # type: ignore[attr-defined]
    builtins.copyright = _sitebuiltins._Printer("copyright", sys.copyright)  # type: ignore[attr-defined]
    builtins.credits = _sitebuiltins._Printer("credits", "See https://www.python.org/")  # type: ignore[attr-defined]
    builtins.license = _sitebuiltins._Printer("license", "See https://www.python.org/psf/license/")  # type: ignore[attr-defined]


if __name__ == "__main__":
    _site_builtins()
    _role = sys.argv[-1] if len(sys.argv) > 1 else ""
    if _role.startswith("--solutions="):
        fork_solutions(int(_role.partition("=")[2]))
    keep() if "--keeper" in sys.argv[1:] else main()
