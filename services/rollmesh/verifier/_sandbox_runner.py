"""The untrusted side of a sandboxed run. Copied into the run's temp dir and started as
`python -I -S -B runner.py [--keeper]` with an empty environment; the service imports it only for
`encode`. `--keeper` (`process` mode): see `keep`.

Contract: this process never holds an expected value or a comparison. It answers requests, one
JSON object per line on stdin, with exactly one frame each on the reply fd (4-byte big-endian
length, then a JSON object with the request's "id"):

    hello {reply_fd, limits, guards,  -> {}              uid dropped (`process` mode as root), rlimits
           drop_to}                                      (soft = hard) and guards set
    load  {code, mode}                -> {}              "asserts": run the code once as `solution`;
                                                         "io": only compile it
    exec  {src, bind, keep}           -> {"changed"?: {}} a test's own statement, in the solution's globals;
                                                         the values of `bind` it changed in place
    eval  {src, bind}                 -> {"value": v}    an expression's value as plain data (`encode`);
                                                         {"error", "opaque": true} when it is not
    main  {stdin}                     -> {"stdout", "exit", "truncated"}  one run as __main__

A failure answers {"error": "..."}. Everything sent back is a claim that the verifier decodes
strictly and compares itself; the solution can rewrite this file's functions, but then all it can
do is claim other values. Before the solution runs, fd 0 becomes /dev/null; stdout and stderr are
the service's diagnostics only, never read for a verdict. The guards (no sockets, no new processes, no
files outside the cwd) are a second line of defence; the kernel (namespaces, chroot, uid,
rlimits) is the first.
"""

from __future__ import annotations

import builtins
import collections
import decimal
import fractions
import io
import json
import math
import os
import resource
import signal
import struct
import sys
from typing import Any

MAX_ERROR_CHARS = 300
MAX_DEPTH = 64
MAX_ITEMS = 100_000
STDOUT_CAP = 1024 * 1024


# -- values as plain data ------------------------------------------------------------------------------


def encode(value: Any, depth: int = 0) -> Any:
    """A value as JSON-able plain data: null, bool, int (as a JSON number while exact), finite float,
    str; everything else a [tag, payload] pair. Iterators, ranges and dict views become lists."""
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
        return ["deque", [encode(v, depth + 1) for v in _bounded(value)]]
    if isinstance(value, dict):
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in _bounded(value.items())]]
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            return [kind.__name__, [encode(v, depth + 1) for v in _bounded(value)]]
    if isinstance(value, range) or (hasattr(value, "__next__") and hasattr(value, "__iter__")):
        return ["list", [encode(v, depth + 1) for v in _bounded(value)]]
    if type(value).__name__ in ("dict_keys", "dict_values", "dict_items"):
        return ["list", [encode(v, depth + 1) for v in _bounded(value)]]
    raise TypeError(f"a {type(value).__name__} is not plain data (compare ints, floats, str, containers)")


def _bounded(items: Any) -> list[Any]:
    out = []
    for item in items:
        out.append(item)
        if len(out) > MAX_ITEMS:
            raise ValueError(f"more than {MAX_ITEMS} items")
    return out


def decode_loose(obj: Any) -> Any:
    """The inverse of `encode`, for the bindings the verifier sends (trusted, so not strict)."""
    if not isinstance(obj, list):
        return obj
    tag, body = obj
    if tag == "int":
        return int(body, 16)
    if tag == "float":
        return float(body)
    if tag == "complex":
        return complex(decode_loose(body[0]), decode_loose(body[1]))
    if tag in ("bytes", "bytearray"):
        return bytes.fromhex(body) if tag == "bytes" else bytearray.fromhex(body)
    if tag == "fraction":
        return fractions.Fraction(decode_loose(body[0]), decode_loose(body[1]))
    if tag == "decimal":
        return decimal.Decimal(body)
    if tag == "dict":
        return {decode_loose(k): decode_loose(v) for k, v in body}
    kinds: dict[str, Any] = {
        "list": list,
        "tuple": tuple,
        "set": set,
        "frozenset": frozenset,
        "deque": collections.deque,
    }
    return kinds[tag](decode_loose(v) for v in body)


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


def _denied(what: str) -> Any:
    def deny(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(f"{what} is not allowed in the sandbox")

    return deny


def _install_guards(workdir: str) -> None:
    import _posixsubprocess
    import socket
    import subprocess

    deny_net = _denied("network access")
    socket.socket = deny_net  # type: ignore[misc,assignment]
    socket.create_connection = deny_net
    socket.socketpair = deny_net
    socket.fromfd = deny_net
    import _socket

    _socket.socket = deny_net  # type: ignore[misc]
    deny_proc = _denied("starting processes")
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
            setattr(os, name, deny_proc)
    _posixsubprocess.fork_exec = deny_proc
    subprocess.Popen = deny_proc  # type: ignore[misc,assignment]

    root = os.path.realpath(workdir)
    allowed_read = tuple(os.path.realpath(p) for p in sys.path if p and os.path.isabs(p))

    def check(path: Any, writing: bool) -> None:
        if isinstance(path, int):
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
    for name in ("listdir", "scandir", "remove", "unlink", "rmdir", "rename", "replace", "mkdir", "chdir"):
        fn = getattr(os, name)

        def wrapped(
            path: Any = ".", *args: Any, _fn: Any = fn, _w: bool = name != "listdir", **kw: Any
        ) -> Any:
            check(path, _w and _fn.__name__ not in ("scandir",))
            return _fn(path, *args, **kw)

        setattr(os, name, wrapped)


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


class Runner:
    def __init__(self) -> None:
        self.globals: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
        self.code: Any = None
        self.reply_fd = -1

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req["op"]
        if op == "load":
            self.code = compile(req["code"], "solution.py", "exec")
            if req["mode"] == "asserts":
                exec(self.code, self.globals)
            return {}
        if op in ("exec", "eval"):
            scope = dict(self.globals)
            scope.update({k: decode_loose(v) for k, v in req.get("bind", {}).items()})
            if op == "exec":
                return self.exec_statement(req["src"], req.get("bind", {}), set(req.get("keep", ())), scope)
            value = eval(compile(req["src"], "test", "eval"), scope)
            try:
                return {"value": encode(value)}
            except TypeError as exc:  # an object of the code's own: the verifier may ask len(), str()...
                return {"error": _short(exc), "opaque": True}
        if op == "main":
            return self.main(str(req["stdin"]))
        raise ValueError(f"unknown request {op!r}")

    def exec_statement(
        self, src: str, bind: dict[str, Any], keep: set[str], scope: dict[str, Any]
    ) -> dict[str, Any]:
        """Run a test's statement. The names it binds stay in the solution's globals (those in
        `keep` too: bound by the statement although the verifier sent their old value); a value
        the verifier sent that the statement changed in place (`rev(x)`) comes back as "changed"."""
        exec(compile(src, "test", "exec"), scope)
        self.globals.update({k: v for k, v in scope.items() if k not in bind or k in keep})
        changed = {}
        for name, sent in bind.items():
            if name not in keep and json.dumps(now := encode(scope[name])) != json.dumps(sent):
                changed[name] = now
        return {"changed": changed} if changed else {}

    def main(self, stdin: str) -> dict[str, Any]:
        sink = _CappedBytes()
        out = io.TextIOWrapper(sink, encoding="utf-8", errors="replace", write_through=True)  # type: ignore[type-var]
        sys.stdin, sys.stdout = io.StringIO(stdin), out
        code: Any = None
        try:
            exec(self.code, {"__name__": "__main__", "__builtins__": builtins})
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.stdin, sys.stdout = io.StringIO(""), sys.__stdout__
        out.flush()
        exit_code = code if code is None or isinstance(code, int) else 1
        return {
            "stdout": sink.data.decode("utf-8", "replace"),
            "exit": exit_code,
            "truncated": sink.truncated,
        }

    def reply(self, ident: int, body: dict[str, Any]) -> None:
        data = json.dumps({"id": ident, **body}).encode()
        frame = struct.pack(">I", len(data)) + data
        while frame:
            frame = frame[os.write(self.reply_fd, frame) :]


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    hello = json.loads(requests.readline())
    runner = Runner()
    runner.reply_fd = os.dup(int(hello["reply_fd"]))
    os.close(int(hello["reply_fd"]))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    sys.stdin = io.StringIO("")
    if hello.get("drop_to") is not None:
        uid = int(hello["drop_to"])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _no_new_privileges()
    _apply_limits(hello["limits"])
    if hello.get("guards", True):
        _install_guards(os.getcwd())
    runner.reply(int(hello["id"]), {})
    del hello
    while True:
        os.set_blocking(requests.fileno(), True)  # the code may have made it non-blocking
        line = requests.readline()
        if not line:
            break
        req = json.loads(line)
        try:
            body = runner.handle(req)
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: all the code's errors
            body = {"error": _short(exc)}
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        runner.reply(int(req["id"]), body)
    os._exit(0)


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
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    keep() if "--keeper" in sys.argv[1:] else main()
