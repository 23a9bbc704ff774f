"""A small pool of worker processes for CPU-bound checks, each call under a hard timeout.

A call that overruns its timeout kills its worker (symbolic math can hang in C code where no
signal reaches it) and the slot is respawned on next use. Workers speak JSON lines over pipes, so
the event loop never blocks: asyncio subprocesses, no multiprocessing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

from rollmesh.mesh.logging import get_logger
from rollmesh.verifier.errors import WorkerError
from rollmesh.verifier.errors import WorkerTimeout

log = get_logger("rollmesh.verifier.workers")

_LINE_LIMIT = 32 * 1024 * 1024
_START_TIMEOUT_S = 120.0
Process = asyncio.subprocess.Process


async def _kill(proc: Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()


class WorkerPool:
    """`await pool.call("pkg.mod:fn", *args, timeout_s=5)` runs `fn(*args)` in a worker process."""

    def __init__(self, size: int, *, name: str = "pool") -> None:
        self.size = size
        self.name = name
        self._slots: asyncio.Queue[Process | None] = asyncio.Queue()
        for _ in range(size):
            self._slots.put_nowait(None)
        self._all: set[Process] = set()
        self._closed = False
        self.restarts = 0
        self.waiting = 0  # calls waiting for a free worker now (the queue depth)
        self.busy = 0  # calls a worker is running now

    async def _spawn(self) -> Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rollmesh.verifier._worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT,
        )
        self._all.add(proc)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), _START_TIMEOUT_S)
            if not line:
                raise WorkerError(f"{self.name} worker exited during start (code {await proc.wait()})")
        except BaseException:
            await _kill(proc)
            self._all.discard(proc)
            raise
        log.debug("worker_started", pool=self.name, pid=proc.pid)
        return proc

    async def warm(self) -> None:
        """Start every worker now (they otherwise start on first use)."""
        slots = [await self._slots.get() for _ in range(self.size)]
        try:
            for i, s in enumerate(slots):
                if s is None or s.returncode is not None:
                    slots[i] = await self._spawn()
        finally:
            for s in slots:
                self._slots.put_nowait(s)

    async def call(self, target: str, *args: Any, timeout_s: float) -> Any:
        if self._closed:
            raise WorkerError(f"{self.name} is closed")
        self.waiting += 1
        try:
            worker = await self._slots.get()
        finally:
            self.waiting -= 1
        self.busy += 1
        keep = False
        try:
            if worker is None or worker.returncode is not None:
                if worker is not None:
                    self._all.discard(worker)
                worker = await self._spawn()
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write((json.dumps({"target": target, "args": list(args)}) + "\n").encode())
            await worker.stdin.drain()
            try:
                line = await asyncio.wait_for(worker.stdout.readline(), timeout_s)
            except TimeoutError:
                self.restarts += 1
                log.warning("worker_timeout_killed", pool=self.name, target=target, timeout_s=timeout_s)
                raise WorkerTimeout(f"{target} took longer than {timeout_s:g}s; worker killed") from None
            if not line:
                raise WorkerError(f"{self.name} worker died (exit code {await worker.wait()})")
            answer = json.loads(line)
            keep = True
            if "error" in answer:
                raise WorkerError(str(answer["error"]))
            return answer["ok"]
        finally:
            self.busy -= 1
            if not keep and worker is not None:
                await _kill(worker)
                self._all.discard(worker)
                worker = None
            self._slots.put_nowait(worker)

    async def aclose(self) -> None:
        self._closed = True
        for proc in list(self._all):
            if proc.stdin is not None:
                proc.stdin.close()
            await _kill(proc)
        self._all.clear()
