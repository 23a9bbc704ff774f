"""Runs untrusted code against tests inside the sandbox. Copied into the run's temp dir and started
as `python -I -S -B runner.py` with an empty environment; never imported by the service.

Protocol: the first stdin line is a JSON object {"nonce", "limits", "guards"}; the result is one
stdout line `<nonce>{json}`. Order: read inputs, set rlimits (soft = hard, so they cannot be
raised), install the guards (no sockets, no new processes, no files outside the cwd), run.
The guards are a second line of defence; the kernel (namespaces, chroot, uid, rlimits) is the first.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import resource
import sys
from typing import Any

MAX_CASES_REPORTED = 50
MAX_ERROR_CHARS = 300


def _limit(which: int, soft: int, hard: int | None = None) -> None:
    try:
        resource.setrlimit(which, (soft, soft if hard is None else hard))
    except (ValueError, OSError):
        pass


def _apply_limits(lim: dict[str, int]) -> None:
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


class _CappedText(io.StringIO):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.size = 0

    def write(self, s: str) -> int:
        self.size += len(s)
        if self.tell() < self.cap:
            super().write(s[: self.cap - self.tell()])
        return len(s)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text[:MAX_ERROR_CHARS]


def _norm(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.strip().splitlines()]
    return lines


def _run(code: str, spec: dict[str, Any], out_cap: int) -> dict[str, Any]:
    cases: list[dict[str, Any]] = []
    try:
        compiled = compile(code, "solution.py", "exec")
    except BaseException as exc:
        return {"passed": 0, "total": len(spec["cases"]), "error": _short(exc), "cases": []}
    if spec["kind"] == "asserts":
        env: dict[str, Any] = {"__name__": "solution", "__builtins__": builtins}
        try:
            exec(compiled, env)
        except BaseException as exc:
            return {"passed": 0, "total": len(spec["cases"]), "error": _short(exc), "cases": []}
        for i, test in enumerate(spec["cases"]):
            try:
                exec(compile(test, f"test_{i}", "exec"), env)
                cases.append({"ok": True})
            except BaseException as exc:
                cases.append({"ok": False, "error": _short(exc)})
    else:
        for case in spec["cases"]:
            sys.stdin = io.StringIO(case["input"])
            buf = _CappedText(out_cap)
            sys.stdout = buf
            error = ""
            try:
                exec(compiled, {"__name__": "__main__", "__builtins__": builtins})
            except SystemExit as exc:
                if exc.code not in (0, None):
                    error = f"SystemExit: {exc.code}"
            except BaseException as exc:
                error = _short(exc)
            finally:
                sys.stdout = sys.__stdout__
            if error:
                cases.append({"ok": False, "error": error})
            elif _norm(buf.getvalue()) == _norm(case["output"]):
                cases.append({"ok": True})
            else:
                got = buf.getvalue()[:MAX_ERROR_CHARS]
                cases.append({"ok": False, "error": f"wrong output: {got!r}"})
    passed = sum(1 for c in cases if c["ok"])
    return {"passed": passed, "total": len(spec["cases"]), "cases": cases[:MAX_CASES_REPORTED]}


def main() -> None:
    cfg = json.loads(sys.stdin.readline())
    nonce = str(cfg.pop("nonce"))
    out_fd = os.dup(1)
    sys.stdin = io.StringIO("")
    with open("solution.py", encoding="utf-8") as f:
        code = f.read()
    with open("tests.json", encoding="utf-8") as f:
        spec = json.load(f)
    _apply_limits(cfg["limits"])
    if cfg.get("guards", True):
        _install_guards(os.getcwd())
    del cfg
    result = _run(code, spec, 64 * 1024)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except BaseException:
            pass
    os.write(out_fd, (nonce + json.dumps(result) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
