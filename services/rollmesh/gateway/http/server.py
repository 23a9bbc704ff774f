"""The OpenAI-compatible HTTP facade's server: uvicorn on the gateway's event loop."""

from __future__ import annotations

from rollmesh.gateway.core import Gateway
from rollmesh.gateway.http.routes import build_app
from rollmesh.mesh.http_serve import HttpServe
from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.gateway.http")


class HttpFacade:
    """The facade's uvicorn server on the gateway's event loop (mesh/http_serve.py; no signal
    handlers of its own: the gateway's `mesh.serve` owns SIGTERM and stops this with the gRPC server)."""

    def __init__(
        self, gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0, api_key: str = ""
    ) -> None:
        self._http = HttpServe(
            build_app(gateway, api_key=api_key),
            host=host,
            port=port,
            what="the OpenAI HTTP facade",
            hint="--http-port 0 picks a free one, -1 turns it off",
        )
        self._gateway = gateway

    @property
    def host(self) -> str:
        return self._http.host

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        port = await self._http.start()
        # A capture's URL is for programs on this host: a wildcard bind is reached on loopback.
        self._gateway.captures.http_root = f"http://{self._http.reach}:{port}"
        log.info("openai_http_started", url=self.base_url)
        return port

    async def stop(self) -> None:
        if not self._http.started:
            return
        self._gateway.captures.http_root = ""
        await self._http.stop()
        log.info("openai_http_stopped", url=self.base_url)
