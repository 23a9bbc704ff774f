"""Run an external agent program under resource limits: `python _program_limits.py LIMITS_JSON -- ARGV...`.

Standard library only (it runs before the program, in the program's own environment, which has no
rollmesh on its path). Asks the kernel to SIGTERM it when the scheduler dies (PR_SET_PDEATHSIG, kept
across exec; done here, not in a `preexec_fn`: the scheduler runs gRPC, whose fork handlers a
`preexec_fn` would run in the child, which then aborted). With `network` in LIMITS_JSON it moves
into a network namespace with only loopback, where the capture's and the tools' ports are relayed
to the scheduler's Unix sockets (`_isolate`; the mode it got is written to `network.mode_file`).
Then it sets the rlimits named in LIMITS_JSON ({"parent": pid, "rlimits": {"RLIMIT_AS": bytes,
...}, "network": {...}}; a limit the platform lacks is skipped), and
replaces itself with ARGV (exit 127 when ARGV cannot be run, the reason on stderr). Its caller
(program.py) has already made it a session leader, so killing the process group ends the program
and everything it started.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: _program_limits.py LIMITS_JSON -- ARGV...\n")
        return 2
    settings = json.loads(argv[0])
    _die_with(int(settings.get("parent", 0)))
    network = settings.get("network")
    if network is not None:
        mode = _isolate(network["forward"])
        with open(network["mode_file"], "w") as f:
            f.write(mode)
    for name, value in settings.get("rlimits", {}).items():
        which = getattr(resource, name, None)
        if which is None:
            continue
        soft = int(value)
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, soft))
    program = argv[2:]
    try:
        os.execvp(program[0], program)
    except OSError as exc:
        sys.stderr.write(f"cannot run {program[0]!r}: {exc.strerror or exc}\n")
        return 127
    return 0  # pragma: no cover - execvp does not return


def _isolate(forward: list[list[Any]]) -> str:
    """A network namespace of its own with only loopback, in which each `[port, unix_socket]` of
    `forward` is served on 127.0.0.1:port by a relay process to that Unix socket (the scheduler's end
    of the capture and tools URLs): "network" once done, "limits" when the kernel refused (not
    permitted: no CAP_SYS_ADMIN), with nothing changed."""
    import ctypes
    import fcntl
    import struct

    if not sys.platform.startswith("linux"):
        return "limits"
    try:
        if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:  # CLONE_NEWNET
            return "limits"
    except (OSError, AttributeError):
        return "limits"
    with socket.socket() as s:  # lo up (SIOCGIFFLAGS / SIOCSIFFLAGS, IFF_UP)
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sh", b"lo", flags | 1))
    listeners = []
    for port, path in forward:
        listener = socket.socket()
        listener.bind(("127.0.0.1", int(str(port))))
        listener.listen(64)
        listeners.append((listener, str(path)))
    program = os.getpid()  # the pid the program will have after exec
    if os.fork() == 0:  # the relay: dies with the program (its parent) and with its process group
        _die_with(program)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # never holds the program's pipes open (its output would not end)
            os.dup2(devnull, fd)
        _relay(listeners)
        os._exit(0)
    for listener, _ in listeners:
        listener.close()
    return "network"


def _relay(listeners: list[tuple[socket.socket, str]]) -> None:
    import threading

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                try:
                    sock.shutdown(how)
                except OSError:
                    pass

    def serve(listener: socket.socket, path: str) -> None:
        while True:
            conn, _ = listener.accept()
            upstream = socket.socket(socket.AF_UNIX)
            try:
                upstream.connect(path)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=pump, args=(conn, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()

    threads = [threading.Thread(target=serve, args=pair, daemon=True) for pair in listeners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _die_with(parent: int) -> None:
    """SIGTERM when `parent` dies (Linux; elsewhere nothing): the shape of mesh/children.py's
    die_with_parent, which cannot be imported here."""
    if not sys.platform.startswith("linux") or not parent:
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the call: the kernel will not tell us
        sys.exit(143)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
