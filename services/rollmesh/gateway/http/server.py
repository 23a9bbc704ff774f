"""The OpenAI-compatible HTTP facade's server: uvicorn on the gateway's event loop."""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

from rollmesh.gateway.core import Gateway
from rollmesh.gateway.http.routes import build_app
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.gateway.http")


class HttpFacade:
    """The facade's uvicorn server on the gateway's event loop (no signal handlers of its own:
    the gateway's `mesh.serve` owns SIGTERM and stops this with the gRPC server)."""

    def __init__(
        self, gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0, api_key: str = ""
    ) -> None:
        config = uvicorn.Config(
            build_app(gateway, api_key=api_key),
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._gateway = gateway
        self._task: asyncio.Task[None] | None = None
        self.host = host
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        config = self._server.config
        if not config.loaded:
            config.load()
        self._server.lifespan = config.lifespan_class(config)
        try:
            await self._server.startup()
        except SystemExit:
            raise ConfigError(
                f"could not bind the OpenAI HTTP facade to {self.host}:{self.port}: is the port in use? "
                "(--http-port 0 picks a free one, -1 turns it off)"
            ) from None
        self.port = int(self._server.servers[0].sockets[0].getsockname()[1])
        self._task = asyncio.create_task(self._server.main_loop(), name="openai-http")
        # A capture's URL is for programs on this host: a wildcard bind is reached on loopback.
        reach = "127.0.0.1" if self.host in ("", "0.0.0.0", "::") else self.host
        self._gateway.captures.http_root = f"http://{reach}:{self.port}"
        log.info("openai_http_started", url=self.base_url)
        return self.port

    async def stop(self) -> None:
        if self._task is None:
            return
        self._gateway.captures.http_root = ""
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self._server.shutdown()
        log.info("openai_http_stopped", url=self.base_url)
