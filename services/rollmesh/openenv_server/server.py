"""`rollmesh serve openenv`: a rollmesh environment as an OpenEnv server, in the foreground.

`serve_openenv(...)` reaches the environment through a verifier's gRPC API (`--verifier`, else a
verifier started in this process over the artifact roots, as `rollmesh reverify` does), checks the
environment can be served (it exists; it does not score groups of rollouts together, which one
OpenEnv episode cannot be), reads the dataset rows a reset plays (`--dataset`, else the
environment's example dataset), then serves the app (app.py) with uvicorn on this event loop until
SIGINT or SIGTERM. What goes wrong before serving is one error: CannotServe, a dataset's own
errors, ConfigError for a port in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from rollmesh.mesh.http_serve import HttpServe
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.server import refuse_a_taken_port
from rollmesh.openenv_server import DEFAULT_MAX_STEPS
from rollmesh.openenv_server import DEFAULT_PORT
from rollmesh.openenv_server.app import build_app
from rollmesh.openenv_server.episode import Episode
from rollmesh.openenv_server.errors import CannotServe
from rollmesh.scheduler.drivers.agent_loop import EnvDescription
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh_client import NotFoundError
from rollmesh_client import max_message_bytes
from rollmesh_client.v1 import verifier_pb2

log = get_logger("rollmesh.openenv_server")

Json = dict[str, object]


class OpenEnvServer:
    """The app on the running event loop (mesh/http_serve.py), with the URL its clients use."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._http = HttpServe(
            app,
            host=host,
            port=port,
            what="the OpenEnv server",
            hint="--port 0 picks a free one",
            ws_max_size=max_message_bytes(),
        )

    @property
    def url(self) -> str:
        return f"http://{self._http.reach}:{self._http.port}"

    async def start(self) -> int:
        """Bind and serve; the bound port. ConfigError when it cannot bind."""
        port = await self._http.start()
        log.info("openenv_server_started", url=self.url)
        return port

    async def stop(self) -> None:
        if self._http.started:
            await self._http.stop()
            log.info("openenv_server_stopped", url=self.url)


async def _describe(env: VerifierEnv, environment: str) -> EnvDescription:
    """What the verifier says of `environment`; CannotServe when it has none such or it scores groups."""
    try:
        description = await env.describe_environment(environment)
    except NotFoundError:
        listed = await env.stub.ListEnvironments(verifier_pb2.ListEnvironmentsRequest(page_size=1000))
        names = ", ".join(sorted(e.name for e in listed.environments)) or "none"
        raise CannotServe(f"unknown environment {environment!r}; the verifier has: {names}") from None
    if description.scores_groups:
        raise CannotServe(
            f"environment {environment!r} scores the rollouts of a task together (a group rubric): one "
            "OpenEnv episode cannot be scored alone"
        )
    return description


def _rows(dataset: str, description: EnvDescription) -> tuple[list[Json], str]:
    """The rows of `dataset` (a path or a dataset artifact), else of the environment's example
    dataset when this machine has it, else none; and where they came from."""
    from rollmesh.registry import Catalog
    from rollmesh.registry import RootsConfig
    from rollmesh.scheduler.plan import load_rows
    from rollmesh.scheduler.plan import resolve_dataset

    if dataset:
        path = resolve_dataset(Catalog.from_config(RootsConfig.from_env()), dataset)
    elif description.example_dataset and Path(description.example_dataset).is_file():
        path = Path(description.example_dataset)
    else:
        return [], ""
    return load_rows(path), str(path)


@contextlib.asynccontextmanager
async def openenv_server(
    *,
    environment: str,
    dataset: str = "",
    verifier: str = "",
    api_key: str = "",
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_sessions: int = 0,
    say: Callable[[str], None] = print,
) -> AsyncIterator[OpenEnvServer]:
    """The server of `environment`, serving until the block ends (module docstring); `say` gets
    the progress lines, the last one naming the URL."""
    # Before anything starts: a taken port is one line, not a verifier started and stopped for nothing.
    refuse_a_taken_port(f"{host}:{port}", "the OpenEnv server")
    async with AsyncExitStack() as stack:
        address = verifier
        if not address:
            from rollmesh.launch.embedded import embedded_verifier

            say("starting a verifier in this process (--verifier HOST:PORT uses a running one)")
            address = await stack.enter_async_context(embedded_verifier(api_key=api_key))
        env = VerifierEnv.connect(address, api_key=api_key or None)
        stack.push_async_callback(env.close)
        description = await _describe(env, environment)
        rows, source = await asyncio.to_thread(_rows, dataset, description)
        connections = itertools.count(1)

        def new_episode() -> Episode:
            return Episode(
                env,
                environment,
                description,
                rows,
                session_prefix=f"openenv/{environment}/{next(connections)}",
                max_steps=max_steps,
            )

        app = build_app(
            new_episode,
            environment=environment,
            description=description.description,
            api_key=api_key,
            max_sessions=max_sessions,
        )
        server = OpenEnvServer(app, host=host, port=port)
        await server.start()
        stack.push_async_callback(server.stop)
        played = f"{len(rows)} rows of {source}" if rows else "no dataset: a reset names its `row`"
        say(
            f"serving environment {environment!r} as OpenEnv at {server.url} "
            f"(WebSocket {server.url}/ws; {played})"
        )
        yield server


async def serve_openenv(*, stop: asyncio.Event | None = None, **options: Any) -> None:
    """`openenv_server(**options)` until SIGINT or SIGTERM (or `stop` is set)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    async with openenv_server(**options):
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
