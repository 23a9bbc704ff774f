"""The OpenEnv server's routes (FastAPI), as openenv-core's `HTTPEnvServer` lays them out:

- `GET /health` (anyone: probes), `GET /metadata`, `GET /schema` (wire.schemas), `GET /state`;
- `POST /reset`, `POST /step`: each HTTP call is a fresh environment, as in OpenEnv's server, so
  `/reset` answers a row's first observation (its session closed at once) and `/step` has no
  episode to act on: after checking the action it answers NoEpisode, naming `/ws`;
- `WS /ws`: one episode per connection (episode.py), messages `reset`, `step`, `state`, `close`;
  a failure is an `error` message (wire.ws_error) and the connection stays open for the next one.
  With `max_sessions`, a connection past it has its first message answered with OpenEnv's
  CAPACITY_REACHED error, and is closed.

With an API key every route but `/health` needs `Authorization: Bearer <key>`, checked by the SDK's
`authorized` as every rollmesh server checks it; a WebSocket without it is refused at the handshake
(HTTP 403), before any episode starts. Errors are one line: `{"detail": "..."}` with the status of
mesh/errors.py `http_status` (422 for an action or reset the schema refuses, as OpenEnv answers).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi import Request
from fastapi import WebSocket
from fastapi.responses import JSONResponse
from fastapi.responses import Response
from starlette.websockets import WebSocketDisconnect

from rollmesh.mesh import untrusted_json
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.errors import Unauthenticated
from rollmesh.mesh.errors import http_status
from rollmesh.mesh.logging import get_logger
from rollmesh.openenv_server import wire
from rollmesh.openenv_server.episode import Episode
from rollmesh.openenv_server.errors import BadAction
from rollmesh.openenv_server.errors import BadReset
from rollmesh.openenv_server.errors import NoEpisode
from rollmesh_client import RollmeshClientError
from rollmesh_client import max_message_bytes
from rollmesh_client._auth import AUTH_HEADER
from rollmesh_client._auth import authorized

log = get_logger("rollmesh.openenv_server")

#: Close code of a WebSocket refused for its token (RFC 6455: policy violation).
WS_POLICY_VIOLATION = 1008


def _fail(exc: RollmeshError) -> JSONResponse:
    return JSONResponse({"detail": wire.describe(exc)}, status_code=http_status(exc))


async def _json_body(request: Request, bad: type[RollmeshError]) -> Any:
    """The body as JSON (None when empty); `bad` naming what is wrong when it is over the message
    limit or not JSON."""
    limit, chunks, size = max_message_bytes(), [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise bad(f"the request body is over {limit:,} bytes (ROLLMESH_MAX_MESSAGE_MB)")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return None
    try:
        return untrusted_json.loads(raw)
    except ValueError as exc:
        raise bad(f"the body is not JSON ({exc})") from None


def build_app(
    new_episode: Callable[[], Episode],
    *,
    environment: str,
    description: str,
    api_key: str = "",
    max_sessions: int = 0,
) -> FastAPI:
    """The app serving `environment`: `new_episode()` makes the episode of one session; at most
    `max_sessions` sessions at once (0: no cap)."""
    sessions = [0]  # open WebSocket sessions (one episode and at most one verifier session each)
    app = FastAPI(title=f"rollmesh environment {environment} (OpenEnv)", docs_url=None, redoc_url=None)

    @app.exception_handler(RollmeshError)
    async def _rollmesh_error(request: Request, exc: RollmeshError) -> Response:
        return _fail(exc)

    @app.exception_handler(RollmeshClientError)
    async def _client_error(request: Request, exc: RollmeshClientError) -> Response:
        return JSONResponse({"detail": str(exc)}, status_code=502)

    def allowed(path: str, given: str) -> bool:
        return path == "/health" or authorized(path, [(AUTH_HEADER, given)], api_key)

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Response:
        if not allowed(request.url.path, request.headers.get(AUTH_HEADER, "")):
            return _fail(Unauthenticated("missing or wrong bearer token: send 'Authorization: Bearer <key>'"))
        response: Response = await call_next(request)
        return response

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": environment,
            "description": description,
            "readme_content": None,
            "version": None,
            "author": None,
            "documentation_url": None,
        }

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return wire.schemas()

    @app.get("/state")
    async def state() -> dict[str, Any]:
        return wire.State(environment=environment).model_dump()

    @app.post("/reset")
    async def reset(request: Request) -> dict[str, Any]:
        params = wire.parse_reset(await _json_body(request, BadReset))
        episode = new_episode()
        try:
            return wire.result(await episode.reset(params))
        finally:
            await episode.close()

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        body = await _json_body(request, BadAction)
        if not isinstance(body, dict) or "action" not in body:
            raise BadAction("a step's body is {\"action\": {...}} (`/schema`'s action)")
        wire.parse_action(body["action"])
        raise NoEpisode(
            "HTTP /step has no episode to act on: each HTTP call is a fresh environment (as in OpenEnv's "
            "server); play an episode over the WebSocket session at /ws"
        )

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        if not allowed("/ws", websocket.headers.get(AUTH_HEADER, "")):
            await websocket.close(code=WS_POLICY_VIOLATION)
            return
        await websocket.accept()
        if max_sessions and sessions[0] >= max_sessions:
            await _refuse_at_capacity(websocket, sessions[0], max_sessions)
            return
        sessions[0] += 1
        episode = new_episode()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text")
                if raw is None:
                    raw = (message.get("bytes") or b"").decode("utf-8", "replace")
                answer = await _answer(episode, raw)
                if answer is None:  # the client closed the session
                    break
                await websocket.send_text(json.dumps(answer, ensure_ascii=False))
        except WebSocketDisconnect:
            pass
        finally:
            sessions[0] -= 1
            await episode.close()
            if websocket.client_state.name == "CONNECTED":
                # The client may have closed its end already (OpenEnv's sends `close`, then closes):
                # our close frame then has nowhere to go, which is no error.
                with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                    await websocket.close()

    return app


async def _refuse_at_capacity(websocket: WebSocket, active: int, cap: int) -> None:
    """A session past the cap: its first message is answered with OpenEnv's CAPACITY_REACHED error
    (so OpenEnv's client raises it from that call, as it raises any server error), then it is closed."""
    error = wire.ws_error(
        f"the server holds {active} sessions, its --max-sessions: close one or retry later",
        "CAPACITY_REACHED",
    )
    error["data"] |= {"active_sessions": active, "max_sessions": cap}
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        if (await websocket.receive())["type"] != "websocket.disconnect":
            await websocket.send_text(json.dumps(error))
            await websocket.close()


async def _answer(episode: Episode, raw: str) -> dict[str, Any] | None:
    """The answer to one WebSocket message; None for `close`."""
    try:
        message = untrusted_json.loads(raw)
    except ValueError as exc:
        return wire.ws_error(f"Invalid JSON: {exc}", "INVALID_JSON")
    if not isinstance(message, dict):
        return wire.ws_error('a message is a JSON object {"type": ..., "data": ...}', "INVALID_JSON")
    kind = message.get("type", "")
    try:
        if kind == "reset":
            obs = await episode.reset(wire.parse_reset(message.get("data")))
            return {"type": "observation", "data": wire.result(obs)}
        if kind == "step":
            obs = await episode.step(wire.parse_action(message.get("data")))
            return {"type": "observation", "data": wire.result(obs)}
        if kind == "state":
            return {"type": "state", "data": episode.state.model_dump()}
        if kind == "close":
            return None
        return wire.ws_error(
            f"Unknown message type: {str(kind)[:80]!r} (reset, step, state, close)", "UNKNOWN_TYPE"
        )
    except (RollmeshError, RollmeshClientError) as exc:
        return wire.ws_error(wire.describe(exc), wire.error_code(exc))
    except Exception as exc:  # a bug here: logged, and one line to the client, never a traceback
        log.error("openenv_message_failed", kind=kind, error=repr(exc))
        return wire.ws_error(f"internal error: {type(exc).__name__}: {exc}", "EXECUTION_ERROR")
