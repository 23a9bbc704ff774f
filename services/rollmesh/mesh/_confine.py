"""Run an untrusted child confined: `python _confine.py SETTINGS_JSON -- ARGV...`.

Standard library only: it runs before the child, in the child's own environment (an agent program's,
a NeMo Gym or verifiers interpreter's), which has no rollmesh on its path. Used by mesh/confine.py
for external agent programs (scheduler/drivers/program.py) and managed environment servers
(launch/sidecar.py). The other standard-library runners load it from its path for what they share:
mesh/_warm.py, and the container machines' verifier/bridges/container/_machine.py (`lead_session`).
SETTINGS_JSON:

    {"parent": pid,              # SIGTERM when it dies (PR_SET_PDEATHSIG, kept across exec)
     "rlimits": {"RLIMIT_AS": bytes, ...},   # a limit the platform lacks is skipped
     "network": {"forward": [[port, unix_socket], ...],    # optional: a network namespace
                 "expose": [[port, unix_socket], ...]},   # (expose: a Unix socket into it)
     "uid": 65533,               # optional: a uid and namespaces of its own (as root)
     "readable": [path, ...],    # what the child must read (uid mode)
     "writable": [path, ...],    # what it may write (uid mode; owned by the uid already)
     "hidden": [path, ...],      # what it must not read though others may (uid mode)
     "scratch_mb": 256,          # size of each fresh /tmp, /var/tmp, /dev/shm (uid mode)
     "mode_file": path}          # where what held is written ("uid+mount+pid+network", "limits")

In order, each step recorded only once it held:
1. `network`: a network namespace with only loopback, where each forwarded port's listening
   socket is made and handed to the parent, which serves it, and each exposed port is reached
   from the parent through a Unix socket a relay process (forked here, before the pid namespace)
   listens on (`_isolate`); refused (no CAP_SYS_ADMIN): nothing changes.
2. `uid` (needs root): a mount namespace (and an IPC namespace: no System V object of another
   process) in which every mount is read-only and nosuid; /tmp,
   /var/tmp and /dev/shm are fresh tmpfs of `scratch_mb`; a folder on the way to a `readable` path
   that other users cannot enter (/root) is covered by an empty tmpfs, with only the `readable`
   paths bound back, read-only (the rest of it, secrets included, is not there); a `hidden` path is
   an empty folder (a tmpfs) or an empty file (/dev/null) there, unless it is itself `readable` or
   `writable`; `readable` and `writable` paths are then bound back (read-only, writable), so they
   win over a cover or a hidden folder above them. Then a pid
   namespace: this process stays outside as the child's keeper (forwards SIGTERM/SIGINT/SIGHUP,
   exits as the child did), the child is pid 1 of its own namespace with a fresh /proc, so
   everything it starts dies with it; it drops to `uid`/`uid` (no supplementary groups,
   `no_new_privs`) and is SIGKILLed if the keeper dies. Pid 1 stays a minimal init (`_init`) and
   ARGV runs as its child, pid 2: the kernel drops signals pid 1 sends itself (a self-SIGKILL, a
   raised SIGTERM, os.abort()'s SIGABRT would be no death, or another one), so the program must not
   be pid 1. The init reaps every orphan, forwards the signals it gets to the program and, when the
   program ends, hands its wait status to the keeper over a pipe and exits (the kernel then kills
   what is left in the namespace); the keeper ends the same way: killed by the same signal, or with
   the same exit code. A warm interpreter's rollout (mesh/_warm.py) is forked into a pid namespace
   the interpreter made, as its pid 1: it takes the network, mount and uid steps there and is the
   init at once (no keeper: the interpreter is the parent that waits and reads the report).
3. rlimits, then exec ARGV (exit 127 when ARGV cannot be run, the reason on stderr), with SIGPIPE
   and SIGXFSZ back to their defaults (this interpreter ignores them; exec would keep that).
The caller has made this process a session leader, so killing the process group ends everything
(a process group spans pid namespaces).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import socket
import sys
from typing import Any

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x08000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
_KEEP_WRITABLE = ("/proc", "/sys", "/dev")  # pseudo filesystems: their own permissions hold


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: _confine.py SETTINGS_JSON -- ARGV...\n")
        return 2
    enter(json.loads(argv[0]))
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    program = argv[2:]
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        sys.stderr.write(f"cannot run {program[0]!r}: {exc.strerror or exc}\n")
        return 127
    return 0  # pragma: no cover - execvp does not return


def enter(settings: dict[str, Any], report: int | None = None) -> None:
    """Steps 1 and 2 and the rlimits (module doc) in this process. It returns only in the process
    that is to run the program (pid 2 of its namespace when it has one); the keeper and the init
    exit here as the program did. A warm interpreter's forked child (mesh/_warm.py) runs it too,
    made pid 1 of a pid namespace of its own by the interpreter: then `report` is the pipe end
    the interpreter reads the program's wait status from, and no keeper is forked (the interpreter
    is the parent that waits)."""
    made = report is not None and os.getpid() == 1  # (the namespace's init already)
    _die_with(int(settings.get("parent", 0)), signal.SIGTERM)
    # Opened first: the mount namespace may cover its folder.
    mode_file = open(settings["mode_file"], "w") if settings.get("mode_file") else None
    held: list[str] = []
    network = settings.get("network")
    if network is not None and _isolate(network.get("forward", []), network.get("expose", [])):
        held.append("network")
    uid: Any = settings.get("uid")
    keeper = False
    if uid is not None and _private_mounts(settings):
        held[:0] = ["uid", "mount"]
        keeper = not made and _unshare(_CLONE_NEWPID)
    init = keeper or made
    if init:
        held.insert(2 if "mount" in held else 0, "pid")
    if mode_file is not None:
        with mode_file:
            mode_file.write("+".join(held) or "limits")
    told = report if made and report is not None else -1  # where the init tells how the program ended
    if keeper:
        pipe = os.pipe()  # (closed in the init at exec)
        child = os.fork()
        if child:
            os.close(pipe[1])
            _exit(_keep(child, pipe[0]))
        os.close(pipe[0])
        told = pipe[1]
    if init and "mount" in held:
        try:  # its own pids in /proc; without it /proc shows the host's (the namespace holds)
            _mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        except OSError:
            pass
    if "uid" in held:
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    if init:  # after the uid change, which clears it. SIGKILL: pid 1 ignores the others.
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))  # (its parent is outside: no getppid check)
    for name, value in settings.get("rlimits", {}).items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        soft = int(value)
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, soft))
    if init:
        program_pid = os.fork()
        if program_pid:
            _exit(_init(program_pid, told))
        os.close(told)


def _exit(code: int) -> None:
    """The keeper's and the init's end: never back into the caller (a warm interpreter's loop)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code & 0xFF)


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(_libc().unshare(flags) == 0)
    except (OSError, AttributeError):
        return False


def _prctl(option: int, value: int) -> bool:
    try:
        return bool(_libc().prctl(option, value, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _mount(
    source: bytes | None, target: bytes, fstype: bytes | None, flags: int, data: bytes | None = None
) -> None:
    import ctypes

    if _libc().mount(source, target, fstype, flags, data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target.decode(errors='replace')}: {os.strerror(errno)}")


def _private_mounts(settings: dict[str, Any]) -> bool:
    """Step 2's mount namespace (module doc); False, with nothing changed, when it cannot be had."""
    # An IPC namespace with it: System V shared memory, semaphores and message queues live there,
    # not in a file system: in the host's, a program found what another had left under a key.
    if os.geteuid() != 0 or not _unshare(_CLONE_NEWNS | _CLONE_NEWIPC):
        return False
    _mount(None, b"/", None, _MS_REC | _MS_PRIVATE)
    readable = [os.path.realpath(p) for p in settings.get("readable", []) if os.path.exists(p)]
    writable = [os.path.realpath(p) for p in settings.get("writable", []) if os.path.exists(p)]
    # A path also to be read (an argument naming it) is not hidden: a bind back would bring the
    # cover along (it is mounted on that very path).
    hidden = [os.path.realpath(p) for p in settings.get("hidden", []) if os.path.exists(p)]
    hidden = [p for p in hidden if p not in readable and p not in writable]
    # Open what is bound back before anything covers it.
    sources = [(p, os.open(p, os.O_PATH), True) for p in readable]
    sources += [(p, os.open(p, os.O_PATH), False) for p in writable]
    for point in _mount_points():
        if point == "/" or not any(_under(point, k) for k in _KEEP_WRITABLE):
            try:
                _mount(None, point.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _mount_flags(point))
            except OSError:
                pass  # a mount point it cannot even see (covered): nothing to do
    scratch = [d for d in _SCRATCH if os.path.isdir(d)]
    size = int(settings.get("scratch_mb", 256))
    for d in scratch:
        _mount(b"scratch", d.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size}m,mode=1777".encode())
    for cover in _covers([p for p, _, _ in sources], scratch):
        _mount(b"hidden", cover.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=755")
    for path in hidden:
        if os.path.isdir(path):
            _mount(b"hidden", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=1m,mode=755")
        elif os.path.exists(path):  # (not already under a scratch tmpfs or a cover)
            _mount(b"/dev/null", path.encode(), None, _MS_BIND)
    for path, fd, read_only in sources:
        if not os.path.exists(path):
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, mode=0o755, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                open(path, "a").close()
        _mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND | _MS_REC)
        flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | (_MS_RDONLY if read_only else 0)
        _mount(None, path.encode(), None, flags)
        os.close(fd)
    try:  # the working folder as the new mounts show it (the old one is read-only, or covered)
        os.chdir(os.getcwd())
    except OSError:
        os.chdir("/")
    return True


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _covers(paths: list[str], scratch: list[str]) -> list[str]:
    """The folders to cover: for each path, the first folder above it that other users cannot
    enter (no o+x), unless a scratch tmpfs or another cover already hides it; outermost first."""
    found: list[str] = []
    for path in paths:
        parts = path.strip("/").split("/")[:-1]
        for n in range(1, len(parts) + 1):
            folder = "/" + "/".join(parts[:n])
            if any(_under(folder, c) for c in [*scratch, *found]):
                break
            try:
                if not os.stat(folder).st_mode & 0o001:
                    found.append(folder)
                    break
            except OSError:
                break
    return sorted(set(found), key=lambda f: f.count("/"))


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            points.append(point.encode().decode("unicode_escape"))  # \040 and friends
    return points


def _mount_flags(point: str) -> int:
    """nosuid always; nodev and noexec kept where the mount had them."""
    flags = _MS_NOSUID
    st = os.statvfs(point)
    if st.f_flag & os.ST_NODEV:
        flags |= _MS_NODEV
    if st.f_flag & os.ST_NOEXEC:
        flags |= _MS_NOEXEC
    return flags


def _forwarding(child: int, signals: Any) -> None:
    """Pass each of `signals` this process gets on to `child`."""

    def forward(signum: int, frame: Any) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in signals:
        signal.signal(sig, forward)


def _keep(child: int, report: int) -> int:
    """Outside the child's pid namespace: pass on the signals a stop sends, and end as the program
    ended (the init's `report`; the init's own status when it wrote none)."""
    _forwarding(child, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
    _, status = os.waitpid(child, 0)
    told = b""
    while chunk := os.read(report, 64):
        told += chunk
    os.close(report)
    if told.strip().isdigit():
        status = int(told)
    if os.WIFSIGNALED(status):
        died = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the program's death, not a crash of ours
        if died not in (signal.SIGKILL, signal.SIGSTOP):  # (their action cannot be set)
            signal.signal(died, signal.SIG_DFL)
        os.kill(os.getpid(), died)
    return os.waitstatus_to_exitcode(status)


# Signals the init never forwards: its own child's, the ones it cannot catch, and those the kernel
# sends a process for its own fault (they are never sent to pid 1 from outside to pass on).
_NOT_FORWARDED = {
    signal.SIGCHLD,
    signal.SIGKILL,
    signal.SIGSTOP,
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGABRT,
    signal.SIGTRAP,
    signal.SIGSYS,
}


def _init(program: int, report: int) -> int:
    """Pid 1 of the namespace while `program` (pid 2) runs: forward signals to it, reap every
    process that ends (orphans are re-parented here), and when `program` ends write its wait status
    to `report` and exit (128 + the signal when a signal killed it)."""
    _forwarding(program, set(signal.valid_signals()) - _NOT_FORWARDED)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:  # cannot be: `program` is ours until reaped
            return 1
        if pid == program:
            os.write(report, str(status).encode())
            os.close(report)
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _isolate(forward: list[list[Any]], expose: list[list[Any]] | None = None) -> bool:
    """A network namespace of its own with only loopback. For each `[port, unix_socket]` of
    `forward` a socket listening on 127.0.0.1:port in it is handed (SCM_RIGHTS) to the parent over
    that Unix socket: the parent accepts the child's connections to its capture and tools ports
    itself (scheduler/drivers/program.py `loopback_relays`). For each `[port, unix_socket]` of
    `expose`, the other way: a relay process listens on that Unix socket (made here, outside the
    namespace's mounts) and connects to 127.0.0.1:port inside (an agent server's port,
    scheduler/drivers/agent_server.py). False when the kernel refused (not permitted: no
    CAP_SYS_ADMIN), with nothing changed."""
    import fcntl
    import struct

    if not _unshare(_CLONE_NEWNET):
        return False
    with socket.socket() as s:  # lo up (SIOCGIFFLAGS / SIOCSIFFLAGS, IFF_UP)
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))
    for port, path in forward:
        with socket.socket() as listener, socket.socket(socket.AF_UNIX) as handoff:
            listener.bind(("127.0.0.1", int(str(port))))
            listener.listen(256)
            handoff.connect(str(path))
            socket.send_fds(handoff, [b"listener"], [listener.fileno()])
    listeners = []
    for port, path in expose or []:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        listener.listen(256)
        listeners.append((listener, int(str(port))))
    if not listeners:
        return True
    program = os.getpid()  # the pid the program (or its keeper) will have after exec
    if os.fork() == 0:  # the relay: dies with the program (its parent) and with its process group
        _die_with(program, signal.SIGTERM)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never holds the program's pipes open (its output would not end)
            os.dup2(devnull, fd)
        _relay(listeners)
        os._exit(0)
    for listener, _ in listeners:
        listener.close()
    return True


def _relay(listeners: list[tuple[socket.socket, int]]) -> None:
    """Each connection to a Unix listener, relayed to its port on this namespace's loopback: one
    thread and a selector (threads per connection would queue on the interpreter's lock)."""
    import selectors

    sel = selectors.DefaultSelector()
    for listener, port in listeners:
        listener.setblocking(False)
        sel.register(listener, selectors.EVENT_READ, port)
    pending: dict[socket.socket, bytes] = {}  # what a socket has yet to send
    peer: dict[socket.socket, socket.socket] = {}
    ended: set[socket.socket] = set()  # its side closed: the pair closes once the other sent all
    watched: set[socket.socket] = set()
    # Our end of each connection to the server acknowledges at once what it reads: a server that
    # writes a reply's headers and body apart without TCP_NODELAY (http.server's default) would
    # otherwise hold the body until our delayed ACK, 40 ms per reply.
    tcp: set[socket.socket] = set()
    quickack = getattr(socket, "TCP_QUICKACK", 0)

    def close(sock: socket.socket) -> None:
        for s in (sock, peer.get(sock)):
            if s is not None and s in peer:
                if s in watched:
                    sel.unregister(s)
                    watched.discard(s)
                pending.pop(s, None)
                ended.discard(s)
                tcp.discard(s)
                del peer[s]
                s.close()

    def watch(sock: socket.socket) -> None:
        # Read while the other side has nothing queued (and this side is open); write while this
        # side has something queued.
        events = selectors.EVENT_WRITE if sock in pending else 0
        if peer[sock] not in pending and sock not in ended:
            events |= selectors.EVENT_READ
        if events and sock in watched:
            sel.modify(sock, events, None)
        elif events:
            sel.register(sock, events, None)
            watched.add(sock)
        elif sock in watched:
            sel.unregister(sock)
            watched.discard(sock)

    while True:
        for key, events in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if key.data is not None:  # a listener
                try:
                    conn, _ = sock.accept()
                except OSError:
                    continue
                upstream = socket.socket()
                try:
                    upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    upstream.setblocking(False)
                    # Never waited for here: a connection the server's full backlog dropped is
                    # tried again by the kernel a second later, and every other one would wait.
                    # Until it is up its sends and reads would block (held as pending); a refused
                    # one fails its first send or read, which closes the pair.
                    code = upstream.connect_ex(("127.0.0.1", int(key.data)))
                    if code not in (0, errno.EINPROGRESS):
                        raise OSError(code, os.strerror(code))
                    tcp.add(upstream)
                except OSError:
                    conn.close()
                    upstream.close()
                    continue
                conn.setblocking(False)
                peer[conn], peer[upstream] = upstream, conn
                watch(conn)
                watch(upstream)
                continue
            if sock not in peer:
                continue
            if events & selectors.EVENT_WRITE and sock in pending:
                try:
                    sent = sock.send(pending[sock])
                except BlockingIOError:
                    sent = 0
                except OSError:
                    close(sock)
                    continue
                rest = pending[sock][sent:]
                if rest:
                    pending[sock] = rest
                else:
                    del pending[sock]
                    if peer[sock] in ended:
                        close(sock)
                        continue
            if events & selectors.EVENT_READ:
                try:
                    chunk = sock.recv(1 << 16)
                    if sock in tcp and quickack:  # (cleared by the kernel: set again after each read)
                        sock.setsockopt(socket.IPPROTO_TCP, quickack, 1)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    if peer[sock] in pending:
                        ended.add(sock)  # (closed when its peer has sent what it holds)
                        watch(sock)
                        continue
                    close(sock)
                    continue
                other = peer[sock]
                try:
                    sent = other.send(chunk)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    close(sock)
                    continue
                if sent < len(chunk):
                    pending[other] = chunk[sent:]
            if sock in peer:
                watch(sock)
                watch(peer[sock])


def lead_session(fds: list[int]) -> None:
    """In a child just forked to run one command: lead a session of its own (its process group is
    what a kill reaches), with `fds` as its descriptors 0, 1, 2 (in order), the originals closed.
    mesh/_warm.py's rollouts and the container machine's commands (_machine.py) start this way."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)


def _die_with(parent: int, sig: signal.Signals) -> None:
    """`sig` when `parent` dies (Linux; elsewhere nothing): the shape of mesh/children.py's
    die_with_parent, which cannot be imported here."""
    if not sys.platform.startswith("linux") or not parent:
        return
    if not _prctl(_PR_SET_PDEATHSIG, int(sig)):
        return
    if os.getppid() not in (parent, 0):  # it died before the call: the kernel will not tell us
        sys.exit(143)  # (0: the parent is outside this process's pid namespace)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
