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
from collections.abc import Sequence
from typing import Any

from rollmesh.mesh.logging import get_logger
from rollmesh.verifier.errors import WorkerError, WorkerTimeout

log = get_logger("rollmesh.verifier.workers")

_LINE_LIMIT = 32 * 1024 * 1024


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()


class WorkerPool:
    """`await pool.call("pkg.mod:fn", *args, timeout_s=5)` runs `fn(*args)` in a worker process."""

    def __init__(
        self, size: int, *, preload: Sequence[str] = (), start_timeout_s: float = 120.0, name: str = "pool"
    ) -> None:
        self.size = size
        self.preload = tuple(preload)
        self.start_timeout_s = start_timeout_s
        self.name = name
        self._slots: asyncio.Queue[_Worker | None] = asyncio.Queue()
        for _ in range(size):
            self._slots.put_nowait(None)
        self._all: set[_Worker] = set()
        self._closed = False
        self.restarts = 0

    async def _spawn(self) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rollmesh.verifier._worker",
            *self.preload,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_LINE_LIMIT,
        )
        worker = _Worker(proc)
        self._all.add(worker)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), self.start_timeout_s)
            if not line:
                raise WorkerError(f"{self.name} worker exited during start (code {await proc.wait()})")
        except BaseException:
            await worker.kill()
            self._all.discard(worker)
            raise
        log.debug("worker_started", pool=self.name, pid=proc.pid)
        return worker

    async def warm(self) -> None:
        """Start every worker now (they otherwise start on first use)."""
        slots = [await self._slots.get() for _ in range(self.size)]
        try:
            for i, s in enumerate(slots):
                if s is None or not s.alive:
                    slots[i] = await self._spawn()
        finally:
            for s in slots:
                self._slots.put_nowait(s)

    async def call(self, target: str, *args: Any, timeout_s: float) -> Any:
        if self._closed:
            raise WorkerError(f"{self.name} is closed")
        worker = await self._slots.get()
        keep = False
        try:
            if worker is None or not worker.alive:
                if worker is not None:
                    self._all.discard(worker)
                worker = await self._spawn()
            assert worker.proc.stdin is not None and worker.proc.stdout is not None
            worker.proc.stdin.write((json.dumps({"target": target, "args": list(args)}) + "\n").encode())
            await worker.proc.stdin.drain()
            try:
                line = await asyncio.wait_for(worker.proc.stdout.readline(), timeout_s)
            except TimeoutError:
                self.restarts += 1
                log.warning("worker_timeout_killed", pool=self.name, target=target, timeout_s=timeout_s)
                raise WorkerTimeout(f"{target} took longer than {timeout_s:g}s; worker killed") from None
            if not line:
                raise WorkerError(f"{self.name} worker died (exit code {await worker.proc.wait()})")
            answer = json.loads(line)
            keep = True
            if "error" in answer:
                raise WorkerError(str(answer["error"]))
            return answer["ok"]
        finally:
            if not keep and worker is not None:
                await worker.kill()
                self._all.discard(worker)
                worker = None
            self._slots.put_nowait(worker)

    async def aclose(self) -> None:
        self._closed = True
        for w in list(self._all):
            if w.proc.stdin is not None:
                w.proc.stdin.close()
            await w.kill()
        self._all.clear()
