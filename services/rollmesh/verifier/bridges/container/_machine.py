"""One machine of the daemonless provider: `python _machine.py SPEC_JSON` (standard library only), or
many: `python _machine.py --factory PARENT_PID FD` forks one per request on the socket FD (the
interpreter and its imports paid for once: daemonless.py uses this; `_factory`).

A machine leads its own session; it becomes the machine and lives until it is killed.
SPEC_JSON:

    {"parent": pid,               # SIGKILL when it dies (PR_SET_PDEATHSIG)
     "dir": "/run/rollmesh/machines/<id>",   # the machine's host folder (made by the caller)
     "lower": [dir, ...],         # the image's layers, top first (overlay lowerdirs, read-only)
     "upper": dir | null,         # where writes go: a folder kept after the machine (an image build),
                                  # or null: a fresh tmpfs of `storage_mb` (a rollout's machine)
     "storage_mb": 1024,
     "network": false,            # true: the host's network (and its resolv.conf); false: its own
                                  # network namespace with only loopback
     "cgroups": [dir, ...],       # cgroup folders it joins first (limits already written)
     "hostname": "m-...",
     "uid_base": 2000000000,      # optional: a user namespace of its own, uids and gids 0-65535
                                  # mapped to uid_base..+65535, the layers mounted idmapped into it
     "ready_fd": 3}               # written "ready\n" once it serves, or "error: ...\n"

In order: the death signal; the cgroups; the user namespace (with `uid_base`; made by a helper
child before the pid namespace, entered last); new mount, UTS, IPC and pid namespaces (and a network
namespace unless `network`); a tmpfs for the writable layer; the overlay of the layers at
`dir/root`; the control socket `dir/ctl.sock` (bound before the root changes); then a fork: this
process stays outside as the keeper (passes on SIGTERM, exits as the init did), the child is pid 1
of the machine: /proc, a minimal /dev (null, zero, full, random, urandom, tty, pts, shm), pivot_root
into the overlay (the host's filesystem is unmounted from its view), it enters its user namespace
(root there: uid_base on the host), the capability bounding set is cut to Docker's default set, and
it serves. Everything mounted lives in the machine's mount namespace
only: when its last process dies the kernel unmounts it all (nothing is left mounted on the host).

The control protocol (one connection per command): the client sends one JSON object
`{"argv": [...], "env": {...}, "cwd": "/app", "user": "root"}` with three descriptors attached
(SCM_RIGHTS: stdin, stdout, stderr); pid 1 forks, the child leads a new session, takes the
descriptors, the user's uid and groups (from the image's /etc/passwd; a number is taken as is) and
the working folder (made when missing, as Docker's WORKDIR), and execs. The reply is one line
`{"exit": code}` (a signal: 128 + its number, as a shell says) or `{"error": "..."}` when it could not
start. The client closing the connection before the reply kills the command's process group
(a timeout). Orphans are reaped by pid 1. A request `{"untar": "/dest", "user": ...}` (no argv) runs
no program: the forked child extracts the tar stream on its stdin into /dest (made when missing)
itself, as `tar -x --no-same-owner` would (files are the user's; links, devices and paths that would
leave /dest are refused: tarfile's data filter), and exits 0, or 1 saying why on stderr.
"""

from __future__ import annotations

import ctypes
import errno
import importlib.util
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tarfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_MNT_DETACH = 2
_CLONE_NEWUSER = 0x10000000
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC, _AT_EMPTY_PATH, _AT_RECURSIVE = 1, 0o2000000, 0x1000, 0x8000
_MOVE_MOUNT_F_EMPTY_PATH, _MOUNT_ATTR_IDMAP = 4, 0x00100000
_SYS_IDMAP = {"x86_64": (428, 429, 442), "aarch64": (428, 429, 442)}  # open_tree, move_mount, mount_setattr
_PR_SET_PDEATHSIG, _PR_CAPBSET_DROP = 1, 24
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
#: Docker's default capability set (moby's oci/caps/defaults.go): every other is dropped.
_KEPT_CAPS = {0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31}
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_libc = ctypes.CDLL(None, use_errno=True)


def _load_confine() -> ModuleType:
    """mesh/_confine.py, standard library only as this file is, loaded from its path: this script
    runs with no package importable (as mesh/_warm.py, which loads it the same way)."""
    mesh = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir, "mesh")
    spec = importlib.util.spec_from_file_location("_rollmesh_confine", os.path.join(mesh, "_confine.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_confine = _load_confine()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--factory"]:
        return _factory(int(argv[1]), int(argv[2]))
    spec = json.loads(argv[0])
    return _machine(spec, int(spec["ready_fd"]))


def _factory(parent: int, fd: int) -> int:
    """Start machines from one process that has paid for the interpreter and its imports once: each
    request on the socket `fd` (one line of the machine's SPEC_JSON with two descriptors: its ready
    pipe and its log) forks a machine, which leads a session of its own; the reply is its pid. Dies
    with `parent` (the verifier); its machines die with it."""
    _check(_libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "prctl")
    if os.getppid() != parent:
        return 1
    signal.signal(signal.SIGCHLD, lambda *_: _reap_all())
    channel = socket.socket(fileno=fd)
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(channel, 1 << 16, 2)
        except InterruptedError:
            continue
        if not data:
            return 0
        spec = json.loads(data.decode())
        spec["parent"] = os.getpid()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            channel.close()
            os.setsid()
            os.dup2(fds[1], 2)
            os.close(fds[1])
            os._exit(_machine(spec, fds[0]))
        for received in fds:
            os.close(received)
        channel.sendall(f"{pid}\n".encode())


def _reap_all() -> None:
    for _ in _exited():
        pass


def _exited() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of each child that has ended, reaped, until none is left to reap now."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status


def _machine(spec: dict[str, Any], ready: int) -> int:
    try:
        server = _setup(spec)
    except Exception as exc:  # reported to the provider, which names it
        _say(ready, f"error: {type(exc).__name__}: {exc}")
        return 1
    child = os.fork()
    if child:
        os.close(ready)
        server.close()
        return _keep(child)
    try:
        _check(_libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "prctl")  # dies with its keeper
        _become_init(spec)
    except Exception as exc:
        _say(ready, f"error: {type(exc).__name__}: {exc}")
        os._exit(1)
    _say(ready, "ready")
    os.close(ready)
    _serve(server)
    return 0


def _say(fd: int, line: str) -> None:
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
    except OSError:
        pass


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _setup(spec: dict[str, Any]) -> socket.socket:
    _check(_libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "prctl")
    if os.getppid() != int(spec["parent"]):
        raise RuntimeError("the verifier died before the machine started")
    for folder in spec.get("cgroups", []):
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if spec.get("uid_base") is not None:  # (before the pid namespace: its helper must not be pid 1)
        spec["_userns_fd"] = _user_namespace(int(spec["uid_base"]))
    flags = _CLONE_NEWNS | _CLONE_NEWUTS | _CLONE_NEWIPC | _CLONE_NEWPID
    if not spec.get("network"):
        flags |= _CLONE_NEWNET
    _check(_libc.unshare(flags), "unshare")
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    base = spec["dir"]
    root = os.path.join(base, "root")
    os.makedirs(root, exist_ok=True)
    upper = spec.get("upper")
    if upper is None:
        rw = os.path.join(base, "rw")
        os.makedirs(rw, exist_ok=True)
        _mount("machine", rw, "tmpfs", _MS_NOSUID, f"size={int(spec['storage_mb'])}m,mode=755")
        upper, work = os.path.join(rw, "upper"), os.path.join(rw, "work")
    else:
        work = os.path.join(base, "work")
    os.makedirs(upper, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    layers = list(spec["lower"])
    uid_base = spec.get("uid_base")
    if uid_base is not None:  # the layers as the machine's user namespace owns them (idmapped)
        userns = int(spec["_userns_fd"])
        layers = [_idmapped(layer, os.path.join(base, f"lower{i}"), userns) for i, layer in enumerate(layers)]
        for folder in (upper, work):
            os.chown(folder, int(uid_base), int(uid_base))
    lower = ":".join(layers)
    _mount("overlay", root, "overlay", 0, f"lowerdir={lower},upperdir={upper},workdir={work}")
    if not spec.get("network"):
        _loopback_up()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.path.join(base, "ctl.sock")
    if os.path.exists(path):
        os.unlink(path)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(64)
    return server


def _user_namespace(base: int) -> int:
    """A descriptor of a new user namespace mapping its uids and gids 0-65535 to base..base+65535:
    made by a child that unshares and waits while this process writes its maps."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        ok = _libc.unshare(_CLONE_NEWUSER) == 0
        os.write(ready_w, b"1" if ok else b"0")
        os.read(go_r, 1)
        os._exit(0)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError("unshare(CLONE_NEWUSER) failed: no user namespaces here")
        for name, text in (
            ("uid_map", f"0 {base} 65536\n"),
            ("gid_map", f"0 {base} 65536\n"),
        ):
            with open(f"/proc/{child}/{name}", "w") as f:
                f.write(text)
        return os.open(f"/proc/{child}/ns/user", os.O_RDONLY)
    finally:
        os.write(go_w, b"x")
        os.waitpid(child, 0)
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _idmapped(source: str, target: str, userns: int) -> str:
    """`source` mounted at `target` with its owners shifted into `userns` (an idmapped mount:
    open_tree, mount_setattr, move_mount); the target."""
    numbers = _SYS_IDMAP.get(os.uname().machine)
    if numbers is None:
        raise RuntimeError(f"idmapped mounts: unknown syscall numbers on {os.uname().machine}")
    open_tree, move_mount, mount_setattr = numbers
    os.makedirs(target, exist_ok=True)
    fd = _libc.syscall(
        open_tree, -100, source.encode(), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
    )
    if fd < 0:
        _check(-1, f"open_tree {source}")
    try:
        attr = _MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, userns)
        flags = _AT_EMPTY_PATH | _AT_RECURSIVE
        _check(_libc.syscall(mount_setattr, fd, b"", flags, ctypes.byref(attr), ctypes.sizeof(attr)), "idmap")
        _check(
            _libc.syscall(move_mount, fd, b"", -100, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH), "move_mount"
        )
    finally:
        os.close(fd)
    return target


def _loopback_up() -> None:
    import fcntl

    with socket.socket() as s:  # SIOCGIFFLAGS / SIOCSIFFLAGS, IFF_UP
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))


def _become_init(spec: dict[str, Any]) -> None:
    root = os.path.join(spec["dir"], "root")
    owner = spec.get("uid_base")
    for sub in ("proc", "dev", "sys", "tmp", "etc"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    _mount("proc", os.path.join(root, "proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    dev = os.path.join(root, "dev")
    _mount("dev", dev, "tmpfs", _MS_NOSUID, "size=64k,mode=755")
    for name in _DEVICES:
        target = os.path.join(dev, name)
        open(target, "w").close()
        _mount(f"/dev/{name}", target, None, _MS_BIND)
    for sub in ("pts", "shm"):
        os.makedirs(os.path.join(dev, sub), exist_ok=True)
    try:
        _mount(
            "devpts", os.path.join(dev, "pts"), "devpts", _MS_NOSUID | _MS_NOEXEC, "newinstance,ptmxmode=0666"
        )
        os.symlink("pts/ptmx", os.path.join(dev, "ptmx"))
    except OSError:
        pass  # no pseudo-terminals: commands run on pipes anyway
    _mount("shm", os.path.join(dev, "shm"), "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64m,mode=1777")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
    ):
        os.symlink(target, os.path.join(dev, name))
    os.symlink("/proc/self/fd/2", os.path.join(dev, "stderr"))
    _mount("sysfs", os.path.join(root, "sys"), "sysfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    etc = os.path.join(root, "etc")
    hostname = str(spec.get("hostname", "machine"))[:63]
    _write_if_possible(os.path.join(etc, "hostname"), hostname + "\n")
    _write_if_possible(os.path.join(etc, "hosts"), f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n")
    if spec.get("network") and os.path.isfile("/etc/resolv.conf"):
        with open("/etc/resolv.conf", "rb") as f:
            resolv = f.read().decode(errors="replace")
        _write_if_possible(os.path.join(etc, "resolv.conf"), resolv)
    old = os.path.join(root, ".oldroot")
    os.makedirs(old, exist_ok=True)
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise RuntimeError(f"pivot_root: unknown syscall number on {os.uname().machine}")
    _check(_libc.syscall(number, root.encode(), old.encode()), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.oldroot", _MNT_DETACH), "umount the host's root")
    os.rmdir("/.oldroot")
    _libc.sethostname(hostname.encode(), len(hostname.encode()))
    if owner is not None:  # the files written above are the machine's root's; then into its userns
        for written in ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf"):
            if os.path.exists(written) and not os.path.islink(written):
                os.chown(written, int(owner), int(owner))
        _check(_libc.setns(int(spec["_userns_fd"]), _CLONE_NEWUSER), "setns into the user namespace")
        os.close(int(spec["_userns_fd"]))
        os.setgroups([0])
        os.setgid(0)
        os.setuid(0)
    for cap in range(64):
        if cap not in _KEPT_CAPS and _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:  # past the kernel's last capability
                break
            raise OSError(ctypes.get_errno(), f"cannot drop capability {cap}")


def _write_if_possible(path: str, text: str) -> None:
    try:
        if os.path.islink(path):
            os.unlink(path)
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        pass


def _keep(child: int) -> int:
    """Outside the machine's pid namespace: pass SIGTERM/SIGINT/SIGHUP on, end as the init ended."""

    def forward(signum: int, frame: Any) -> None:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) & 0xFF


def _serve(server: socket.socket) -> None:
    """pid 1: start commands, report their exits, reap orphans, kill a command whose client left."""
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    signal.set_wakeup_fd(writer)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ, "accept")
    sel.register(reader, selectors.EVENT_READ, "signal")
    running: dict[int, socket.socket] = {}  # pid -> its client
    clients: dict[socket.socket, int] = {}  # client -> pid
    while True:
        for key, _ in sel.select():
            if key.data == "accept":
                conn, _ = server.accept()
                sel.register(conn, selectors.EVENT_READ, "request")
            elif key.data == "signal":
                os.read(reader, 4096)
                _reap(running, clients, sel)
            else:
                client = key.fileobj
                assert isinstance(client, socket.socket)
                conn = client
                if conn in clients:  # the client left before the command ended: kill it
                    pid = clients.pop(conn)
                    running.pop(pid, None)
                    _kill_group(pid)
                    sel.unregister(conn)
                    conn.close()
                    continue
                sel.unregister(conn)
                pid = _start(conn)
                if pid > 0:
                    running[pid] = conn
                    clients[conn] = pid
                    sel.register(conn, selectors.EVENT_READ, "request")
                else:
                    conn.close()
        _reap(running, clients, sel)


def _kill_group(pid: int) -> None:
    for target in (-pid, pid):
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _reap(running: dict[int, socket.socket], clients: dict[socket.socket, int], sel: Any) -> None:
    for pid, status in _exited():
        conn = running.pop(pid, None)
        if conn is None:
            continue  # an orphan
        clients.pop(conn, None)
        code = os.waitstatus_to_exitcode(status)
        _kill_group(pid)  # what it left running in its session dies with it, as in a shell's job
        try:
            conn.sendall((json.dumps({"exit": 128 - code if code < 0 else code}) + "\n").encode())
        except OSError:
            pass
        sel.unregister(conn)
        conn.close()


def _start(conn: socket.socket) -> int:
    """Read one request and fork its command; the pid, or -1 (the error already sent)."""
    try:
        conn.settimeout(10)
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(data.decode())
        if len(fds) != 3:
            raise ValueError("a request carries stdin, stdout and stderr")
        uid, gid, groups, home = _user(str(request.get("user") or "root"))
    except Exception as exc:
        _reply_error(conn, f"bad request: {exc}")
        return -1
    pid = os.fork()
    if pid == 0:
        try:
            _confine.lead_session(fds)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            cwd = str(request.get("cwd") or "/")
            try:
                os.makedirs(cwd, exist_ok=True)
                os.chdir(cwd)
            except OSError:
                os.chdir("/")
            if "untar" in request:
                _untar(str(request["untar"]))
            env = {str(k): str(v) for k, v in dict(request.get("env") or {}).items()}
            env.setdefault("HOME", home)
            argv = [str(a) for a in request["argv"]]
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:
            try:
                os.write(2, f"cannot run the command: {exc}\n".encode())
            finally:
                os._exit(127)
    for fd in fds:
        os.close(fd)
    return pid


def _untar(dest: str) -> None:
    """The `untar` request's work in the command's child (the module docstring); never returns."""
    try:
        os.makedirs(dest, exist_ok=True)
        with os.fdopen(0, "rb", closefd=False) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(dest, filter="data")
    except Exception as exc:
        os.write(2, f"cannot copy into {dest}: {exc}\n".encode())
        os._exit(1)
    os._exit(0)


def _reply_error(conn: socket.socket, text: str) -> None:
    try:
        conn.sendall((json.dumps({"error": text}) + "\n").encode())
    except OSError:
        pass


def _user(name: str) -> tuple[int, int, list[int], str]:
    """uid, gid, supplementary groups and home of `name` (a name in the image's /etc/passwd, or a
    number; `user:group` too). Read by hand: the host's NSS modules are not the image's."""
    base, _, group = name.partition(":")
    users = _table("/etc/passwd")
    entry = next((u for u in users if base in (u[0], u[2])), None)
    if entry is None:
        if not base.isdigit():
            raise KeyError(f"no user {base!r} in the image's /etc/passwd")
        uid, gid, user, home = int(base), int(base), "", "/"
    else:
        user, uid, gid, home = entry[0], int(entry[2]), int(entry[3]), entry[5]
    groups = _table("/etc/group")
    if group:
        found = next((g for g in groups if group in (g[0], g[2])), None)
        if found is None:
            raise KeyError(f"no group {group!r} in the image's /etc/group")
        gid = int(found[2])
    extra = {int(g[2]) for g in groups if user and user in g[3].split(",")}
    return uid, gid, sorted({gid, *extra}), home


def _table(path: str) -> list[list[str]]:
    try:
        with open(path) as f:
            rows = [line.rstrip("\n").split(":") for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return []
    return [r + [""] * (7 - len(r)) for r in rows if len(r) >= 4 and r[2].isdigit()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
