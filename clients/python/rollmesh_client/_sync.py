"""`SyncClient`: the same API as `Client` for code without an event loop.

    with SyncClient.connect() as c:
        for a in c.registry.artifacts("dataset"):
            print(a.name)
        job = c.scheduler.submit(spec)          # a SyncJobHandle: .result(), .cancel(), .rollouts()

It runs a private event loop on a background thread; every coroutine method blocks until done and
every async iterator becomes a plain iterator (pulled one item at a time, so streams stay lazy).
Like Ray's `DeploymentResponse.result()`, it refuses to run inside a running event loop: use
`Client` there.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Coroutine
from collections.abc import Iterator
from types import TracebackType
from typing import Any
from typing import TypeVar

from rollmesh_client._client import Client

T = TypeVar("T")


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rollmesh-sync", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RuntimeError(
                "SyncClient cannot be used inside a running event loop; use rollmesh_client.Client"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, ait: AsyncIterator[T]) -> Iterator[T]:
        async def step() -> tuple[bool, T | None]:
            try:
                return True, await ait.__anext__()
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, item = self.run(step())
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            closer = getattr(ait, "aclose", None)
            if closer is not None:
                self.run(closer())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


class _SyncProxy:
    """Wraps any object of the async SDK: coroutine methods block, async iterators iterate."""

    def __init__(self, target: Any, loop: _Loop) -> None:
        self._target = target
        self._loop = loop

    def _wrap(self, value: Any) -> Any:
        if inspect.iscoroutine(value):
            return self._wrap(self._loop.run(value))
        if inspect.isasyncgen(value) or isinstance(value, AsyncIterator):
            return (self._wrap(v) for v in self._loop.iterate(value))
        if type(value).__module__.startswith("rollmesh_client._"):
            return _SyncProxy(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return self._wrap(attr)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._wrap(attr(*args, **kwargs))

        return call


class SyncClient:
    """Blocking twin of `Client` (same properties: registry, verifier, gateway, scheduler)."""

    def __init__(self, client: Client, loop: _Loop) -> None:
        self._client = client
        self._loop = loop

    @classmethod
    def connect(cls, **kwargs: Any) -> SyncClient:
        """Same keyword arguments as `Client.connect`."""
        loop = _Loop()
        client = loop.run(Client.connect(**kwargs))
        return cls(client, loop)

    def __getattr__(self, name: str) -> Any:
        if name in ("registry", "verifier", "gateway", "scheduler"):
            return _SyncProxy(self._loop.run(_get(self._client, name)), self._loop)
        raise AttributeError(name)

    def close(self) -> None:
        self._loop.run(self._client.close())
        self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


async def _get(client: Client, name: str) -> Any:
    # Channels are created on the SDK's loop thread, where they will be used.
    getter: Callable[[], Any] = lambda: getattr(client, name)  # noqa: E731
    return getter()
