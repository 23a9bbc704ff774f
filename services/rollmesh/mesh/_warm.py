"""A warm interpreter for a Python agent program: `PYTHON _warm.py SETTINGS_JSON`.

Standard library only: it runs in the program's own interpreter (its virtualenv, which has no
rollmesh), started by scheduler/drivers/warm.py. It confines itself first, imports what the
program's top level imports, then forks one process per rollout, which confines itself as
mesh/_confine.py's `enter` does for an exec'd program (a uid, mounts, pid and network namespaces
of the rollout's own) and only then runs the program's code. SETTINGS_JSON:

    {"parent": pid,                        # SIGTERM when it dies
     "control_fd": n,                      # its end of the control socket (SOCK_SEQPACKET)
     "program": ["script.py", args...] | ["-m", "module", args...] | ["-c", "code", args...],
     "network": true,                      # a network namespace of its own, with nothing in it
     "readable": [path, ...], "writable": [path, ...], "scratch_mb": 256}   # mounts (as root)

1. Itself: the death signal, a network namespace with only loopback (no port relayed: only its
   children reach their URLs, each through a namespace of its own), and as root a mount namespace
   where every mount is read-only but `writable` (the folder the rollouts' folders are made in),
   folders closed to other users empty but for `readable` (`_confine._private_mounts`). It stays
   root: it must give each rollout its uid.
2. Imports: each module the program's top level imports (`import x`, `from x import y`, also
   inside a top-level `try`), when it is found outside the program's own folders (its script's,
   the PYTHONPATH entries: `_own_folders`): installed packages, never the program's own modules
   (found without importing a package on the way, for `-m pkg.mod`), whose code runs only in a
   rollout's process, nor a
   module that is a script (`_script`: a package's `__main__`, `this`, CPython's `test`). A
   module that fails to import is left to the program (it fails there, as it would cold).
   Its heap then goes on 2 MB pages where the kernel can (`_huge_pages`): each fork copies a
   page-table entry per 2 MB instead of 512 (0.75 ms less per fork here, and as much in the
   init's fork of the program).
3. Says `{"ready": true, "imported": [...]}` and serves requests, one datagram each (SOCK_SEQPACKET):
       {"op": "fork", "id": n, "confine": _confine settings, "cwd": dir, "env": {...}}
           with three fds: the program's stdin, stdout, stderr
           -> {"forked": n, "pid": p}   later   {"exited": p, "code": c}   (c < 0: killed by signal -c)
       {"op": "kill", "pid": p}  -> SIGKILL to its process group (while it is not reaped)
   The socket's end (the scheduler gone) ends it, its rollouts' processes with it.
4. Learns: a rollout's process, when its program is done, writes the names of the modules it
   imported (a line each) to a pipe this interpreter reads (at most `READS_PER_ROUND` reads between
   serving requests and exits: a program writing that pipe without end holds up no other rollout);
   each name it was not given before is imported here for the rollouts forked after, under step
   2's rule (`_Learner`: found on this interpreter's own path, outside the program's folder and
   outside the rollouts' folders). Step 5 runs again only when a round learned something. An SDK
   that imports its HTTP stack and resources on first use (openai: 70 modules, over half a warm
   rollout's CPU) pays that once per job instead of once per rollout. The report is the program's
   word, taken as untrusted: a name not found there is ignored.
5. Makes ahead, after step 2 and after each round of step 4, what the installed libraries would
   otherwise build afresh in every rollout from the machine alone (mesh/_warm_ahead.py): a spare
   TLS context per factory (the CA bundle parsed once), the platform facts, and the pydantic models
   rollouts report they completed (a line `model N`: an index into this interpreter's own list).

A rollout's process: its own session, the given fds as 0, 1 and 2 (nothing else of the
interpreter's but the step 4 pipe's write end: the control socket, the other rollouts' status pipes
and the interpreter's pid namespace are closed), `_confine.enter` with the rollout's settings, the
environment replaced by `env`, `cwd`, then the program run as `python ARGS` would run it
(`runpy`), step 4's report, and its exit status as Python's. As root the interpreter forks it as
pid 1 of a pid namespace of its own (`_PidNamespaces`): it takes its network and mount namespaces
and its uid there and becomes the program's init, the program its child (pid 2), and tells the
interpreter the program's wait status over a pipe (`_told`): two forks of this interpreter per
rollout, where `_confine.enter` alone would fork a keeper outside the namespace too.
"""

from __future__ import annotations

import os
import sys

# This folder shadows standard modules (logging.py): never import from it. It is sys.path[0] unless
# the program's options (-I) left it out.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    sys.path.pop(0)

import ast  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import runpy  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import traceback  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

_MAX_MESSAGE = 1 << 22


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_rollmesh{name}", os.path.join(_HERE, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_confine = _load("_confine")
_ahead = _load("_warm_ahead")


def main(argv: list[str]) -> int:
    settings = json.loads(argv[0])
    program: list[str] = settings["program"]
    _confine._die_with(int(settings.get("parent", 0)), signal.SIGTERM)
    if settings.get("network"):
        _confine._isolate([])
    if os.geteuid() == 0 and settings.get("writable") is not None:
        # What this interpreter runs on, whatever launched it (a pyenv shim, a link): its prefixes.
        own = [os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, *sys.path]
        settings["readable"] = [*settings.get("readable", []), *filter(os.path.isabs, own)]
        _confine._private_mounts(settings)
    control = socket.socket(fileno=int(settings["control_fd"]))
    readable = list(settings.get("readable", []))  # (what a rollout's own mounts show again)
    imported = _preload(program)
    ahead = _ahead.Ahead()
    ahead.prepare()
    gc.collect()
    gc.freeze()  # what it imported is never scanned by a rollout's collector (nor copied for it)
    _huge_pages()
    _send(control, {"ready": True, "imported": imported})
    writable = [os.path.realpath(w) for w in settings.get("writable") or []]
    learner = _Learner(_own_folders(program), writable, ahead)
    return _serve(control, program, readable, learner)


def _own_folders(program: list[str]) -> list[str]:
    """The program's own folders, whose modules are never imported here: a script's folder and the
    PYTHONPATH entries (where `python -m` finds a program's own modules, and a script its own
    libraries); installed packages are what the interpreter's prefixes and .pth files add."""
    folders = [] if program[0] in ("-m", "-c") else [os.path.dirname(os.path.abspath(program[0]))]
    folders += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [os.path.realpath(f) for f in folders]


def _preload(program: list[str]) -> list[str]:
    """Step 2 (module doc): the names imported."""
    own = _own_folders(program)
    if program[0] == "-m":
        spec = _path_spec(program[1])
        source_path = spec.origin if spec is not None else None
    elif program[0] == "-c":
        source_path = None
    else:
        source_path = os.path.abspath(program[0])
        if not _safe_path():
            sys.path.insert(0, os.path.dirname(source_path))  # as `python script.py` has it
    source = program[1] if program[0] == "-c" else _read(source_path)
    imported = []
    for name in _top_level_imports(source):
        if not _installed(name, own) or _script(name):
            continue  # the program's own module: it runs only in a rollout's process
        try:
            __import__(name)
        except Exception:
            continue
        imported.append(name)
    return imported


def _safe_path() -> bool:
    """-I or -P: the program's folder (or the working one) is not put first on sys.path."""
    return bool(sys.flags.isolated or getattr(sys.flags, "safe_path", False))


def _path_spec(name: str) -> Any:
    """`name`'s spec found on sys.path without importing the packages on the way (finding
    `pkg.mod` with importlib would run the program's own `pkg/__init__.py` here)."""
    spec = None
    locations = None
    parts = name.split(".")
    for n in range(1, len(parts) + 1):
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:n]), locations)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    return spec


def _installed(name: str, closed: list[str]) -> bool:
    """`name`'s top-level module is found on this interpreter's path, nowhere under `closed`."""
    top = name.partition(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    places = [spec.origin or "", *(spec.submodule_search_locations or [])]
    for place in filter(os.path.isabs, places):
        real = os.path.realpath(place)
        if any(real == c or real.startswith(c.rstrip(os.sep) + os.sep) for c in closed):
            return False
    return True


# Standard modules that act when imported (print, open a browser, run CPython's test suite or IDLE):
# imported in each rollout, where the program would see them act, never here.
_SCRIPTS = frozenset({"__hello__", "__phello__", "antigravity", "idlelib", "test", "this", "turtledemo"})


def _script(name: str) -> bool:
    """A module that is a script rather than a library (a package's `__main__`, step 2's and step
    4's exception): importing it runs it, here, as root, for every rollout after (a rollout that
    reported `test.__main__` had CPython's test runner enable faulthandler and rewrite sys.path in
    the interpreter)."""
    parts = name.split(".")
    return "__main__" in parts or parts[0] in _SCRIPTS


def _read(path: str | None) -> str:
    if not path or not path.endswith(".py"):
        return ""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _top_level_imports(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Try):
            body[:0] = [*node.body, *[n for h in node.handlers for n in h.body], *node.orelse]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module != "__future__":
                names.append(node.module)
    return list(dict.fromkeys(names))


class _Learner:
    """Step 4 (module doc): the modules rollouts reported importing, imported here in turn.

    A rollout's report is untrusted (the program's own code ran in that process): each line is a
    name, taken only when it is a dotted identifier whose top-level package is found on this
    interpreter's own path outside the program's folder and outside every folder rollouts can write
    (`_installed`) and not a script (`_script`), as the top-level imports are (`_preload`); each
    name is tried once, at most
    MAX_LEARNED in all."""

    MAX_LEARNED = 4096
    _NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")

    def __init__(self, own: list[str], writable: list[str], ahead: Any) -> None:
        self.ahead = ahead  # (mesh/_warm_ahead.py `Ahead`)
        self.loaded = frozenset(sys.modules)  # what a rollout forked now starts with
        self.closed = [p for p in (*own, *writable) if p]
        self.tried: set[str] = set()
        self.partial = b""
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    #: What one round reads at the most (`take`), in reads of 64 KiB.
    READS_PER_ROUND = 4

    def take(self) -> None:
        """Read what rollouts reported, a bounded amount a round: rollouts writing their reports
        without end (each write as fast as it is read) must not keep the interpreter from serving
        forks and exits; the rest waits in the pipe for the next round. Import the new names."""
        data = self.partial
        for _ in range(self.READS_PER_ROUND):
            try:
                chunk = os.read(self.read_fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        *lines, rest = data.split(b"\n")
        self.partial = rest[-_MAX_NAME:]
        learned = self.ahead.learned
        fresh = False
        for line in lines:
            name = line.decode("ascii", errors="replace").strip()
            if self.ahead.take(name):  # (step 5's lines)
                continue
            if (
                name in self.tried
                or name in sys.modules
                or len(self.tried) >= self.MAX_LEARNED
                or len(name) > _MAX_NAME
                or not self._NAME.fullmatch(name)
            ):
                continue
            self.tried.add(name)
            if _installed(name, self.closed) and not _script(name):
                try:
                    __import__(name)
                    fresh = True
                except BaseException:  # (its rollouts import it themselves, as they would cold)
                    continue
        if fresh or self.ahead.learned != learned:  # (a line told before changes nothing)
            self.ahead.prepare()
            self.loaded = frozenset(sys.modules)
            gc.collect()
            gc.freeze()
            _huge_pages()


_MAX_NAME = 512


def _report(fd: int, before: frozenset[str], ahead: Any) -> None:
    """A rollout's word to its interpreter (steps 4 and 5): the modules it imported and the models
    it completed, a line each, in writes of at most PIPE_BUF bytes (never split, never mixed with
    another rollout's); dropped when the pipe is full."""
    try:
        names = [n for n in _new_modules(before) if n != "__main__" and len(n) < _MAX_NAME]
        names += ahead.report()
        os.set_blocking(fd, False)
        chunk = b""
        for name in sorted(names):
            line = name.encode("ascii", errors="replace") + b"\n"
            if len(chunk) + len(line) > select.PIPE_BUF:
                os.write(fd, chunk)
                chunk = b""
            chunk += line
        if chunk:
            os.write(fd, chunk)
    except Exception:  # (the program's state: whatever it left)
        pass


def _huge_pages() -> None:
    """This interpreter's heap on 2 MB pages where the kernel can (MADV_COLLAPSE, Linux 6.1+): a fork
    copies one page-table entry per 2 MB instead of 512, for each rollout (and its init's fork of
    the program); a rollout's write still copies 4 kB. Nothing changes where the kernel refuses."""
    try:
        libc = _confine._libc()
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except (OSError, AttributeError):
        return
    huge = 1 << 21
    for line in lines:
        fields = line.split()
        if fields[1] != "rw-p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue  # (anonymous private memory only: the heap and the allocators' arenas)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start, end = (start + huge - 1) & ~(huge - 1), end & ~(huge - 1)
        if end - start >= huge and libc.madvise(start, end - start, _MADV_HUGEPAGE) == 0:
            libc.madvise(start, end - start, _MADV_COLLAPSE)


_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25


def _new_modules(before: frozenset[str]) -> list[str]:
    """The modules imported since the fork (`before`: the interpreter's then): the newest entries of
    sys.modules (a dict keeps insertion order) from its end back to the first one the interpreter
    held, so that the thousands of names it holds are never touched (a touch of each name's
    reference count would copy every page they are on: a millisecond per rollout)."""
    names = []
    for name in reversed(sys.modules):
        if name in before:
            break
        names.append(name)
    return names


def _send(control: socket.socket, message: dict[str, Any]) -> None:
    control.send(json.dumps(message).encode())


def _serve(control: socket.socket, program: list[str], readable: list[str], learner: _Learner) -> int:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, int] = {}  # pid -> where its init tells the program's wait status (or -1)
    spaces = _PidNamespaces()
    while True:
        ready, _, _ = select.select([control.fileno(), wake_r, learner.read_fd], [], [])
        if learner.read_fd in ready:
            learner.take()
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 4096):
                        break
                except BlockingIOError:
                    break
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _send(
                control, {"exited": pid, "code": os.waitstatus_to_exitcode(_told(children.pop(pid), status))}
            )
        if control.fileno() not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 3)
        if not data:  # the scheduler is gone: so are its rollouts
            for pid in children:
                _kill(pid)
            return 0
        request = json.loads(data)
        if request.get("op") == "kill":
            if int(request["pid"]) in children:
                _kill(int(request["pid"]))
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        report = os.pipe() if "uid" in request["confine"] and spaces.open() else None
        pid = -1
        try:
            pid = os.fork()
        finally:
            if report is not None and pid != 0:
                spaces.close()
        if pid == 0:
            # Nothing of the interpreter's but the report pipe: not the other rollouts' status
            # pipes (their read ends would let this program take how theirs ended), not the pid
            # namespace this interpreter goes back to.
            told = [fd for fd in children.values() if fd >= 0]
            for fd in (wake_r, wake_w, learner.read_fd, *told, *([report[0]] if report else [])):
                os.close(fd)
            spaces.forget()
            control.close()
            if "uid" in request["confine"]:
                request["confine"]["readable"] = readable
            _end(_rollout(request, fds, program, learner, report[1] if report else None))
        for fd in fds:
            os.close(fd)
        if report is not None:
            os.close(report[1])
            os.set_blocking(report[0], False)
        children[pid] = report[0] if report is not None else -1
        _send(control, {"forked": request["id"], "pid": pid})


def _told(fd: int, status: int) -> int:
    """A rollout's wait status: its program's, as its init wrote it to `fd`; the init's own when it
    wrote none (it was killed)."""
    if fd < 0:
        return status
    try:
        told = os.read(fd, 64)
    except OSError:
        told = b""
    finally:
        os.close(fd)
    return int(told) if told.strip().isdigit() else status


class _PidNamespaces:
    """A pid namespace for each rollout's process, made here (as root): the process forked while
    one is open is pid 1 of it, the program's init, and this interpreter waits for it (no keeper
    process in between: one fork of this interpreter fewer per rollout)."""

    def __init__(self) -> None:
        self.own = -1
        if os.geteuid() == 0:
            try:
                self.own = os.open("/proc/self/ns/pid", os.O_RDONLY)
            except OSError:
                pass

    def open(self) -> bool:
        """The next fork's child is pid 1 of a new pid namespace (False: the kernel refused)."""
        return self.own >= 0 and _confine._unshare(_confine._CLONE_NEWPID)

    def forget(self) -> None:
        """In a rollout's process: the interpreter's own namespace is not its to hold."""
        if self.own >= 0:
            os.close(self.own)
            self.own = -1

    def close(self) -> None:
        """Forks after are in this interpreter's own pid namespace again."""
        if _confine._libc().setns(self.own, _confine._CLONE_NEWPID) != 0:
            os.close(self.own)  # (no namespace of our making after this: each child makes its own)
            self.own = -1


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _rollout(
    request: dict[str, Any], fds: list[int], program: list[str], learner: _Learner, report: int | None
) -> int:
    """A rollout's process (module doc); returns the program's exit status."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _confine.lead_session(fds)
    os.chdir(request["cwd"])
    _confine.enter(request["confine"], report)  # an init (or keeper) does not come back
    os.environ.clear()
    os.environ.update(request["env"])
    import tempfile

    tempfile.tempdir = None  # TMPDIR is the rollout's
    try:
        if program[0] == "-m":
            sys.argv = [program[1], *program[2:]]
            if not _safe_path():
                sys.path.insert(0, os.getcwd())  # as `python -m` has it
            runpy.run_module(program[1], run_name="__main__", alter_sys=True)
        elif program[0] == "-c":
            sys.argv = ["-c", *program[2:]]
            sys.path[0:0] = [] if _safe_path() else [""]
            exec(
                compile(program[1], "<string>", "exec"),
                {"__name__": "__main__", "__builtins__": __builtins__},
            )
        else:
            sys.argv = list(program)
            runpy.run_path(program[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        _report(learner.write_fd, learner.loaded, learner.ahead)
    return 0


def _end(code: int) -> None:
    """A rollout process's end, as Python's own but for the teardown of the modules the
    interpreter imported (a collection over its whole inherited heap, copying every page it
    touches): wait for its threads, run its atexit functions, flush, exit."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    try:
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
