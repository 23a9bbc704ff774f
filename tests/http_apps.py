"""An aiohttp application served on a free 127.0.0.1 port for a test (scripted upstreams)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serve_app(app: web.Application, port: int = 0) -> AsyncIterator[str]:
    """Serve `app` on `port` (0: a free one) until the block ends; yields its origin,
    `http://127.0.0.1:PORT`."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
