"""Warm start for per-rollout Python agent programs: one interpreter per job run with the program's
imports done (mesh/_warm.py), forked per rollout into the rollout's own confinement.

A cold program pays its interpreter's start and its imports in every rollout (`import openai`: about
1.6 s of CPU); a warm one pays them once, and the modules its rollouts import later (an SDK's HTTP
stack, at its first call) once more, learned from the rollouts' reports (mesh/_warm.py step 4).
What a rollout's process gets is what an exec'd program gets (program.py `PerRollout`: its folder,
task file, variables, stdin, the same `_confine` steps with its leased uid, its pid and network
namespaces, rlimits), except that it starts as a copy of the warm interpreter: the modules imported
there are already loaded (their state as the import left it), and its folder is under the
interpreter's `root` (every mount else read-only).

`WarmStart` is a `PerRollout` whose `spawn` asks the interpreter for a fork. The interpreter starts at
the first rollout (and again when it died: its rollouts in flight fail as their program would, by
signal); a program the interpreter cannot run warm (not `python SCRIPT`, `python -m MODULE` or
`python -c CODE`) is refused when the job starts (`warm_argv`), never run cold in its place. The
interpreter imports as root, in its own read-only mount and network namespaces: it runs only
modules installed outside the program's folder (mesh/_warm.py), and sees each rollout's URLs and
tokens as it forks it (docs/external-agents.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from rollmesh.mesh.aio import read_capped
from rollmesh.mesh.children import kill_group
from rollmesh.mesh.confine import CONFINE
from rollmesh.mesh.confine import Confinement
from rollmesh.mesh.confine import UidLeases
from rollmesh.mesh.confine import program_paths
from rollmesh.mesh.confine import read_mode
from rollmesh.mesh.confine import settings
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler.drivers.modes import warm_argv
from rollmesh.scheduler.drivers.program import HostRun
from rollmesh.scheduler.drivers.program import PerRollout
from rollmesh.scheduler.drivers.program import ProgramSpec
from rollmesh.scheduler.drivers.program import RolloutIO
from rollmesh.scheduler.drivers.program import RolloutProcess
from rollmesh.scheduler.drivers.program import program_environment
from rollmesh.scheduler.drivers.program import resolved_argv
from rollmesh.scheduler.errors import AgentProgramUnstartable

log = get_logger("rollmesh.scheduler.warm")

WARM = CONFINE.with_name("_warm.py")


class _Interpreter:
    """The started mesh/_warm.py process and our end of its control socket."""

    def __init__(self, proc: asyncio.subprocess.Process, control: socket.socket) -> None:
        self.proc = proc
        self.control = control
        self.ids = itertools.count()
        self.forked: dict[int, asyncio.Future[int]] = {}
        self.exited: dict[int, asyncio.Future[int]] = {}
        self.reader: asyncio.Task[None] | None = None
        self.drain: asyncio.Future[None] | None = None

    async def read(self) -> None:
        """Its messages, to the futures waiting on them; its end fails every one still waiting."""
        loop = asyncio.get_running_loop()
        try:
            while data := await loop.sock_recv(self.control, 1 << 16):
                message = json.loads(data)
                if "forked" in message:
                    fut = self.forked.pop(int(message["forked"]), None)
                    if fut is not None and not fut.done():
                        fut.set_result(int(message["pid"]))
                elif "exited" in message:
                    done = self.exited.setdefault(int(message["exited"]), loop.create_future())
                    if not done.done():
                        done.set_result(int(message["code"]))
        except (OSError, ValueError):
            pass
        finally:
            for fut in [*self.forked.values(), *self.exited.values()]:
                if not fut.done():
                    fut.set_result(-9)  # gone with the interpreter (its death signal is SIGKILL)

    def alive(self) -> bool:
        return self.proc.returncode is None and self.reader is not None and not self.reader.done()

    async def fork(self, request: dict[str, Any], fds: list[int]) -> int:
        n = next(self.ids)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.forked[n] = fut
        socket.send_fds(self.control, [json.dumps({**request, "op": "fork", "id": n}).encode()], fds)
        pid = await fut
        self.exited.setdefault(pid, asyncio.get_running_loop().create_future())
        return pid

    def kill(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            self.control.send(json.dumps({"op": "kill", "pid": pid}).encode())

    async def close(self) -> None:
        tasks = [t for t in (self.reader, self.drain) if t is not None]
        for task in tasks:  # (a read pending on a socket closed under it would never end)
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.control.close()
        kill_group(self.proc)
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


class WarmStart(PerRollout):
    """Per-rollout programs forked from a warm interpreter (module doc)."""

    def __init__(self, program: ProgramSpec, uids: UidLeases | None = None) -> None:
        self.python, self.args = warm_argv(program.argv)
        # (-O, -I, -E ...: the interpreter's options the command line names, the warm one's too)
        self.options = list(program.argv[1 : len(program.argv) - len(self.args)])
        super().__init__(uids, self._spawn, mode="warm")
        self._interpreter: _Interpreter | None = None
        self._lock = asyncio.Lock()
        self.starts = 0
        self.imported: list[str] = []

    async def run(self, program: ProgramSpec, rollout: RolloutIO) -> HostRun:
        if self.root is None:  # the folder every rollout's folder is made in (module doc)
            async with self._lock:
                if self.root is None:
                    self.root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="rollmesh-warm-"))
                    await asyncio.to_thread(os.chmod, self.root, 0o711)
        return await super().run(program, rollout)

    async def stop(self) -> None:
        async with self._lock:
            if self._interpreter is not None:
                await self._interpreter.close()
                self._interpreter = None
            if self.root is not None:
                await asyncio.to_thread(shutil.rmtree, self.root, True)
                self.root = None

    async def _spawn(self, program: ProgramSpec, process: RolloutProcess) -> HostRun:
        base, work, variables, forward, uid = (
            process.base,
            process.work,
            process.variables,
            process.forward,
            process.uid,
        )
        interpreter = await self._started(program, network=forward is not None)
        t0 = time.monotonic()
        mode_file = base / "sandbox"
        confinement = Confinement(
            rlimits=program.rlimits, uid=uid, writable=(str(work),), hidden=program.hidden, forward=forward
        )
        request = {
            "confine": settings(confinement, mode_file, parent=interpreter.proc.pid),
            "cwd": str(work),
            "env": program_environment(program, work, variables),
        }
        task_fd = os.open(variables["ROLLMESH_TASK_FILE"], os.O_RDONLY)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            pid = await interpreter.fork(request, [task_fd, out_w, err_w])
        finally:
            for fd in (task_fd, out_w, err_w):
                os.close(fd)
        run = HostRun()
        loop = asyncio.get_running_loop()
        streams = []
        try:
            for fd in (out_r, err_r):
                reader = asyncio.StreamReader(limit=1 << 20)
                transport, _ = await loop.connect_read_pipe(
                    functools.partial(asyncio.StreamReaderProtocol, reader), os.fdopen(fd, "rb", 0)
                )
                streams.append((reader, transport))
            async with asyncio.timeout(program.timeout_s):
                (run.stdout, run.stdout_cut), (run.stderr, run.stderr_cut) = await asyncio.gather(
                    *(read_capped(r, program.output_limit) for r, _ in streams)
                )
                run.exit_code = await interpreter.exited[pid]
        except TimeoutError:
            run.timed_out = True
        finally:
            if run.exit_code is None:
                interpreter.kill(pid)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(interpreter.exited[pid]), 10.0)
            interpreter.exited.pop(pid, None)
            for _, transport in streams:
                transport.close()
            if len(streams) < 2:
                for fd in (out_r, err_r)[len(streams) :]:
                    os.close(fd)
            run.seconds = time.monotonic() - t0
        run.sandbox = await asyncio.to_thread(read_mode, mode_file)
        return run

    async def _started(self, program: ProgramSpec, *, network: bool) -> _Interpreter:
        interpreter = self._interpreter
        if interpreter is not None and interpreter.alive():
            return interpreter
        async with self._lock:
            if self._interpreter is not None:
                if self._interpreter.alive():
                    return self._interpreter
                log.warning("warm_interpreter_died", code=self._interpreter.proc.returncode)
                await self._interpreter.close()
                self._interpreter = None
            self._interpreter = await self._start(program, network=network)
            return self._interpreter

    async def _start(self, program: ProgramSpec, *, network: bool) -> _Interpreter:
        assert self.root is not None  # (made by `run`)
        environment = program_environment(program, self.root, {"ROLLMESH_MODEL": ""})
        argv = await resolved_argv(program, environment)
        readable = await asyncio.to_thread(program_paths, argv, environment.get("PATH"))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zygote_settings = {
            "parent": os.getpid(),
            "control_fd": theirs.fileno(),
            "program": self.args,
            "network": network,
            "readable": [*readable, str(WARM.parent)],
            "writable": [str(self.root)],
            "hidden": list(program.hidden),
            "scratch_mb": 256,
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                argv[0],
                *self.options,
                str(WARM),
                json.dumps(zygote_settings),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.root,
                env=environment,
                start_new_session=True,
                pass_fds=(theirs.fileno(),),
            )
        except OSError as exc:
            ours.close()
            raise AgentProgramUnstartable(f"cannot start the agent program {argv[0]!r}: {exc}") from None
        finally:
            theirs.close()
        self.starts += 1
        ours.setblocking(False)
        interpreter = _Interpreter(proc, ours)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(program.timeout_s):
                first = await loop.sock_recv(ours, 1 << 16)
        except TimeoutError:
            first = b""
        if not first:
            err = b""
            if proc.stderr is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    err, _ = await asyncio.wait_for(read_capped(proc.stderr, program.output_limit), 5.0)
            await interpreter.close()
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise AgentProgramUnstartable(
                f"the warm interpreter of {' '.join(program.argv)[:200]!r} did not start"
                + (f": {tail[0][:300]}" if tail[0] else "")
            )
        self.imported = list(json.loads(first).get("imported", []))
        interpreter.reader = asyncio.ensure_future(interpreter.read())
        if proc.stderr is not None:
            interpreter.drain = asyncio.ensure_future(_discard(proc.stderr))
        log.info("warm_interpreter_up", imported=self.imported, starts=self.starts)
        return interpreter


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(1 << 16):
        pass
