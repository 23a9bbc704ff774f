"""An ASGI app served by uvicorn on the running event loop, for the mesh's HTTP doors (the gateway's
OpenAI facade, the OpenEnv server): bound at `start()` (port 0 picks a free one; a port that cannot
be bound is a one-line ConfigError naming the door and how to pick another), its main loop a task of
this loop, stopped by `stop()`; while it runs, its port is one this process serves itself
(mesh/loopback.py). No lifespan and no signal handlers of its own: the process that
starts it owns SIGTERM and stops it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import uvicorn

from rollmesh.mesh import loopback
from rollmesh.mesh.errors import ConfigError


class HttpServe:
    """`app` on `host:port` (module docstring); `what` names the door in errors, `hint` says how to
    pick another port, `options` are uvicorn.Config's."""

    def __init__(self, app: Any, *, host: str, port: int, what: str, hint: str, **options: Any) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            **options,
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None
        self._factory: loopback.ProtocolFactory | None = None
        self._what, self._hint = what, hint
        self.host = host
        self.port = port

    @property
    def reach(self) -> str:
        """The host a client on this machine connects to (loopback for a wildcard bind)."""
        return "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host

    async def start(self) -> int:
        """Bind and serve; returns the bound port."""
        config = self._server.config
        if not config.loaded:
            config.load()
        self._server.lifespan = config.lifespan_class(config)
        try:
            await self._server.startup()
        except SystemExit:
            raise ConfigError(
                f"could not bind {self._what} to {self.host}:{self.port}: is the port in use? ({self._hint})"
            ) from None
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        # A confined program's socket for this port is served by this server (mesh/loopback.py),
        # its connections counted with the ones uvicorn accepts itself (closed at shutdown).
        protocol: Any = config.http_protocol_class  # (called as uvicorn's Server.startup does)
        self._factory = functools.partial(
            protocol,
            config=config,
            server_state=self._server.server_state,
            app_state=self._server.lifespan.state,
        )
        loopback.serve_here(self.port, self._factory)
        self._task = asyncio.create_task(self._server.main_loop(), name=self._what)
        return self.port

    @property
    def started(self) -> bool:
        return self._task is not None

    async def stop(self) -> None:
        if self._task is None:
            return
        if self._factory is not None:
            loopback.forget(self.port, self._factory)
            self._factory = None
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self._server.shutdown()
