"""Small asyncio helpers every service uses: the event loop a server process runs on (`run_server`), a set
of kept background tasks, a race of awaitables (`first_of`), and a thread that lives as long as the
process for blocking calls whose side effects belong to the calling thread."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any
from typing import TypeVar

from rollmesh.mesh.heap import raise_gc_threshold

T = TypeVar("T")


def run_server(
    main: Coroutine[Any, Any, T], *, event_loop: str = "auto", uvloop_ok: bool = True, gc_tuned: bool = True
) -> T:
    """Run a server process's main coroutine to its end, on the loop ROLLMESH_EVENT_LOOP names
    (mesh/config.py): "uvloop" (ImportError when not installed), "asyncio", or "auto": uvloop when
    installed and the process declares it safe (`uvloop_ok`), else asyncio. uvloop cuts the loop's
    cost per message for grpc.aio and aiohttp alike (about a quarter of the scheduler's and gateway's
    CPU per rollout on the HTTP model path, bench/http_model_path.py). `gc_tuned`: the collector's
    serving threshold (mesh/heap.py) first."""
    if gc_tuned:
        raise_gc_threshold()
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if event_loop == "uvloop" or (event_loop == "auto" and uvloop_ok):
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:
            if event_loop == "uvloop":
                raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


class TaskSet:
    """Keeps a reference to each background task until it ends; `aclose` cancels and awaits the rest."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def join(self) -> None:
        """Wait until every task has ended, those spawned meanwhile included."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_of(*aws: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    """Run `aws` until one ends, then cancel the others and wait for them (all of them when this is
    cancelled). Returns their tasks in order: a loser reads `cancelled()`, the winner its outcome."""
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return tasks


class ProcessLifetimeThread:
    """Runs blocking calls, one at a time, on one daemon thread that lives until the process exits.

    `asyncio.to_thread` is wrong for a call that starts child processes tied to the *calling thread*:
    Ray starts its GCS and raylet with `PR_SET_PDEATHSIG`, which the kernel fires when the thread that
    spawned them exits, and the default executor's threads exit when `asyncio.run` ends (or after an
    exception unwinds it) while the process lives on: the local cluster would be SIGKILLed under it.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _loop(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # delivered to the awaiting caller
                fut.set_exception(exc)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        fut: Future[T] = Future()
        self._jobs.put((lambda: fn(*args, **kwargs), fut))
        return await asyncio.wrap_future(fut)


async def read_capped(stream: asyncio.StreamReader | None, cap: int) -> tuple[bytes, bool]:
    """Read a child's pipe to EOF keeping the first `cap` bytes (diagnostics only; the rest is
    dropped, so a chatty child never grows memory): the bytes kept and whether any were dropped."""
    head, total = bytearray(), 0
    if stream is None:
        return b"", False
    while chunk := await stream.read(1 << 16):
        total += len(chunk)
        if len(head) < cap:
            head += chunk[: cap - len(head)]
    return bytes(head), total > cap
