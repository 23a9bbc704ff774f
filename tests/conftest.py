"""Shared fixtures: real grpc.aio servers on 127.0.0.1 ephemeral ports, waited on by health."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest_asyncio

from rollmesh.mesh.server import MeshServer, ServiceBinding, build_server, wait_serving

StartServer = Callable[..., Awaitable[MeshServer]]


@pytest_asyncio.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """`server = await start_server([binding, ...], api_key="")`: started, SERVING, stopped after the test."""
    started: list[MeshServer] = []

    async def start(bindings: Sequence[ServiceBinding], *, api_key: str = "") -> MeshServer:
        server = await build_server(bindings, "127.0.0.1:0", api_key=api_key)
        await server.start()
        started.append(server)
        await wait_serving(server.address, timeout_s=30)
        return server

    try:
        yield start
    finally:
        for s in started:
            await s.stop(grace=0)
