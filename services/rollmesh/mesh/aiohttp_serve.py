"""An aiohttp application served on the running event loop, for the mesh's small aiohttp doors (an
agent program's tool endpoint, the devtools OpenAI test server): `start()` binds `host:port` (port 0
picks a free one) and returns the bound port; `stop()` closes it and may be called again. With
`loopback`, while it runs its port is one this process serves itself (mesh/loopback.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from rollmesh.mesh import loopback as served


class AiohttpServe:
    """One aiohttp application's runner and site (module docstring)."""

    def __init__(self, *, loopback: bool = False) -> None:
        self._loopback = loopback
        self._runner: web.AppRunner | None = None
        self._factory: served.ProtocolFactory | None = None
        self.port = 0

    @property
    def started(self) -> bool:
        return self._runner is not None

    async def start(
        self, app: web.Application, host: str, port: int, *, backlog: int = 128, **runner: Any
    ) -> int:
        """Serve `app` on `host:port`; `runner` are web.AppRunner's options. Returns the bound port."""
        started = web.AppRunner(app, **runner)
        await started.setup()
        await web.TCPSite(started, host, port, backlog=backlog).start()
        self._runner, self.port = started, int(started.addresses[0][1])
        if self._loopback and started.server is not None:
            self._factory = started.server
            served.serve_here(self.port, started.server)  # a program's handed socket, served here
        return self.port

    async def stop(self) -> None:
        if self._factory is not None:
            served.forget(self.port, self._factory)
            self._factory = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
