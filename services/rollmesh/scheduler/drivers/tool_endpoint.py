"""The environment's tools over HTTP for external agent programs (program.py): one loopback server
per job run, one unguessable path per rollout (the path is the credential; it dies with the rollout).

    GET  <url>        -> {"tools": [{"type": "function", "function": {name, description, parameters}}]}
    POST <url>/call   {"name": "...", "arguments": {...} or "<json>", "id": "..."}
                      -> {"output": "...", "is_error": false, "ends_agent": false}
                      (`ends_agent`: the environment ended the agent, e.g. its time is up)

A call runs through the scheduler's env port (the verifier's CallTool, under the job's watchdog and
timing), exactly as the built-in loop runs a tool call. A body that is not such an object is 400; an
unknown or closed path is 404; a tool the rollout was not offered is answered as the verifier answers
it (an error result), never run elsewhere. The server binds 127.0.0.1 and starts on first use.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.aiohttp_serve import AiohttpServe
from rollmesh.mesh.logging import get_logger
from rollmesh.scheduler.drivers.agent_loop import Json
from rollmesh.scheduler.drivers.agent_loop import ToolResult

log = get_logger("rollmesh.scheduler.tools")

ToolHandler = Callable[[Json], Awaitable[ToolResult]]
MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass
class _Route:
    tools: list[Json]
    handler: ToolHandler
    calls: int = 0


class ToolEndpoint:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._routes: dict[str, _Route] = {}
        self._serve = AiohttpServe(loopback=True)
        self._root = ""
        self._starting = asyncio.Lock()

    async def open(self, tools: list[Json], handler: ToolHandler) -> tuple[str, str]:
        """A URL for one rollout's tools (`tools`: name/description/parameters), and its key for
        `close`."""
        await self._start()
        key = secrets.token_urlsafe(18)
        self._routes[key] = _Route(tools, handler)
        return f"{self._root}/tools/{key}", key

    def close(self, key: str) -> int:
        """Forget a rollout's URL; returns how many tool calls it served."""
        route = self._routes.pop(key, None)
        return 0 if route is None else route.calls

    async def stop(self) -> None:
        self._routes.clear()
        await self._serve.stop()

    async def _start(self) -> None:
        async with self._starting:
            if self._serve.started:
                return
            app = web.Application(client_max_size=MAX_BODY_BYTES)
            app.router.add_get("/tools/{key}", self._list)
            app.router.add_post("/tools/{key}/call", self._call)
            port = await self._serve.start(app, self.host, 0, access_log=None)
            self._root = f"http://{self.host}:{port}"
            log.info("tool_endpoint_started", url=self._root)

    def _route(self, request: web.Request) -> _Route:
        route = self._routes.get(request.match_info["key"])
        if route is None:
            raise web.HTTPNotFound(text=json.dumps({"error": "no such rollout (it is over)"}))
        return route

    async def _list(self, request: web.Request) -> web.Response:
        route = self._route(request)
        tools = [{"type": "function", "function": t} for t in route.tools]
        return web.json_response({"tools": tools})

    async def _call(self, request: web.Request) -> web.Response:
        route = self._route(request)
        try:
            body = untrusted_json.loads(await request.read())
        except ValueError as exc:
            return _bad(f"the body is not JSON ({exc})")
        if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
            return _bad('the body must be an object with a "name" and "arguments"')
        args = body.get("arguments", {})
        call = {
            "id": str(body.get("id") or ""),
            "type": "function",
            "function": {
                "name": body["name"],
                "arguments": args if isinstance(args, str) else json.dumps(args),
            },
        }
        route.calls += 1
        result = await route.handler(call)
        return web.json_response(
            {"output": result.output, "is_error": result.is_error, "ends_agent": result.ends_agent}
        )


def _bad(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)
