"""The solution's sandbox, pre-started: one per concurrent run, forking a fresh process per run.

Starting a sandbox (unshare, a chroot of read-only binds built by a dozen mount(8)s, a Python)
took ~130 ms of a run's ~145 ms; forking one that is up takes ~2 ms. So in `namespaces` mode as
root, a `Forker` is a sandbox started once (the same namespaces and chroot a fresh run had) whose
process stays root inside it and only ever runs `_sandbox_runner.fork_solutions`. Per run it
mounts a fresh tmpfs as /sandbox and forks a child that gets the run's own pipes (requests,
replies, stdout, stderr, passed over a unix socket) and nothing else, its own session and the
run's leased uid, and is then a fresh runner: the code, the tests and every answer travel only on
that child's pipes, never through the forker, so a child inherits nothing of another run. At the
end the forker SIGKILLs every other process of its pid namespace (what the run left included) and
reports the child's exit status; a forker that does not answer so is stopped, never reused.

What stays as a fresh sandbox per run had it: its own uid (leased per run, RLIMIT_NPROC per run),
a fresh /sandbox of the run's size, the rlimits and guards set by the child before the code
loads, no process of the run surviving it, no network, the read-only chroot. What differs: runs
of one slot share the pid, mount, net, ipc and uts namespaces one after another (never at once),
and the forker (root, not dumpable, another uid) sits in the run's pid namespace as its pid 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from rollmesh.verifier.errors import ChannelBroken
from rollmesh.verifier.sandbox._sandbox_runner import REPLY_FD

END_TIMEOUT_S = 10.0  # for the forker to kill and reap what a run left


@dataclass
class Forker:
    """A started `fork_solutions` process: `proc` (unshare, its session leader), our end of its
    control socket, what stops it (`stack`), and its output drained (`drain`)."""

    proc: asyncio.subprocess.Process
    control: socket.socket
    stack: contextlib.AsyncExitStack
    drain: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    keep: bool  # kept for later runs (the isolation probe's is not)
    usable: bool = True

    async def fork(self, uid: int, disk_mb: int) -> Forked:
        """Ask for a run's process (its reply, `Forked.started`, says it is up)."""
        pipes = [os.pipe() for _ in range(4)]  # requests, replies, stdout, stderr
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1], pipes[3][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0], pipes[3][0]]
        try:
            self.send({"op": "fork", "uid": uid, "disk_mb": disk_mb}, theirs)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        requests, replies, out, err = ours
        writer = await _writer(self.loop, requests)
        (stdout, out_pipe), (stderr, err_pipe) = await _reader(self.loop, out), await _reader(self.loop, err)
        return Forked(self, writer, stdout, stderr, replies, pipes=[out_pipe, err_pipe])

    async def ready(self) -> None:
        """Its first message, once it is up."""
        if (await self.receive()).get("ready") is not True:
            self.usable = False
            raise ChannelBroken("the solution's sandbox did not say it is up")

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        """One request (a few bytes: with one request at a time, the socket always has room)."""
        try:
            socket.send_fds(self.control, [json.dumps(message).encode()], fds or [])
        except OSError as exc:
            self.usable = False
            raise ChannelBroken(f"the solution's sandbox closed its control socket ({exc})") from None

    async def receive(self) -> dict[str, Any]:
        try:
            data = await self.loop.sock_recv(self.control, 1 << 16)
            reply = json.loads(data) if data else None
        except (OSError, ValueError):
            reply = None
        if type(reply) is not dict:
            self.usable = False
            raise ChannelBroken("the solution's sandbox closed its control socket")
        return reply


@dataclass
class Forked:
    """The solution's process of one run, forked by a `Forker`: its stdin (requests), stdout and
    stderr, and our end of its reply pipe (`REPLY_FD` there)."""

    forker: Forker
    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    reply_fd: int
    child_fd: int = REPLY_FD
    drop_to: int | None = None
    returncode: int | None = None
    ended: bool = False
    pipes: list[asyncio.BaseTransport] = field(default_factory=list, repr=False)  # stdout, stderr
    _forked: bool = field(default=False, repr=False)

    @property
    def clock(self) -> tuple[int, int]:
        """What `clock` counts: the descendants of the forker (not unshare, not the forker,
        which was up before the run's clock started: `Sandbox._forker`)."""
        return self.forker.proc.pid, 2

    async def started(self) -> None:
        reply = await self.forker.receive()
        if type(reply.get("pid")) is not int:
            self.forker.usable = False
            raise ChannelBroken(f"the solution's sandbox did not fork: {str(reply)[:200]}")
        self._forked = True

    def discard(self) -> None:
        """Close our ends of its pipes when the run never got as far as reading them (`Sandbox._supervise`
        reads them and owns the reply fd)."""
        for pipe in self.pipes:
            pipe.close()
        os.close(self.reply_fd)

    async def wait(self) -> int | None:
        """The process's exit status, given most of a second to exit on its own (then it is killed)."""
        await self.end(0.8)
        return self.returncode

    async def stop(self) -> None:
        await self.end(0.0)

    async def end(self, grace_s: float) -> None:
        """Kill what the run left (the process included) and learn its exit status; a forker that
        does not answer so is never reused."""
        if self.ended:
            return
        self.ended = True
        self.stdin.close()
        if not self._forked or not self.forker.usable:
            self.forker.usable = False
            return
        try:
            self.forker.send({"op": "end", "grace_s": grace_s})
            async with asyncio.timeout(grace_s + END_TIMEOUT_S):
                reply = await self.forker.receive()
        except BaseException as exc:  # cancelled too: its answer would be read as the next run's
            self.forker.usable = False
            if isinstance(exc, (ChannelBroken, TimeoutError)):
                return
            raise
        status = reply.get("status")
        if status is not None and type(status) is not int:
            self.forker.usable = False
            return
        self.returncode = status if status is not None else -9


async def _reader(
    loop: asyncio.AbstractEventLoop, fd: int
) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    reader = asyncio.StreamReader(limit=1 << 16)
    pipe, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
    )
    return reader, pipe


async def _writer(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(fd, "wb", 0)
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)
