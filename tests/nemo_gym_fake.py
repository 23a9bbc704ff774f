"""A small server speaking NeMo Gym's resources-server protocol, for the bridge's fast tests (the real
servers run in the NeMo Gym virtualenv: tests/integration/test_nemo_gym_*.py).

It keeps a counter per session as example_session_state_mgmt does: the session lives in a signed
cookie set on the first call, so a client that drops the cookie starts a new session at 0 (the
failure NeMo Gym users hit with aiohttp's default jar on 127.0.0.1). Like NeMo Gym's strict request
models it refuses a row whose `responses_create_params` holds a null field (422). `faults` scripts
/verify: "500", "garbage" (not JSON), "no_reward", "hang".
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from aiohttp import web

from tests.http_apps import serve_app

COOKIE = "StatefulCounterResourcesServer___counter"
_KEY = b"test-secret"


@dataclass
class FakeGym:
    counters: dict[str, int] = field(default_factory=dict)
    closed: list[str] = field(default_factory=list)
    calls: list[tuple[str, bool]] = field(default_factory=list)  # (path, carried a valid cookie)
    faults: dict[str, str] = field(default_factory=dict)
    reverify_mode: str | None = None  # None: no /reverify_mode route (NeMo Gym < 0.7)
    verify_extra: dict[str, Any] = field(default_factory=dict)
    release: asyncio.Event = field(default_factory=asyncio.Event)  # ends a hung answer

    def _session(self, request: web.Request) -> str | None:
        raw = request.cookies.get(COOKIE, "")
        sid, _, sig = raw.partition(".")
        good = hmac.new(_KEY, sid.encode(), hashlib.sha256).hexdigest()[:16]
        return sid if sid and hmac.compare_digest(sig, good) else None

    def _reply(self, request: web.Request, body: Any) -> tuple[web.Response, str]:
        """The answer, with a new session's cookie when the call carried none; and the session."""
        sid = self._session(request)
        self.calls.append((request.path, sid is not None))
        resp = web.json_response(body)
        if sid is None:
            sid = uuid.uuid4().hex
            self.counters.setdefault(sid, 0)
            resp.set_cookie(COOKIE, f"{sid}.{hmac.new(_KEY, sid.encode(), hashlib.sha256).hexdigest()[:16]}")
        return resp, sid

    async def seed(self, request: web.Request) -> web.Response:
        row = await request.json()
        params = row.get("responses_create_params") or {}
        if any(v is None for v in params.values()) or not isinstance(row.get("initial_count"), int):
            return web.json_response({"detail": "validation error"}, status=422)
        resp, sid = self._reply(request, {})
        self.counters[sid] = row["initial_count"]
        return resp

    async def increment_counter(self, request: web.Request) -> web.Response:
        args = await request.json()
        resp, sid = self._reply(request, {"success": True})
        self.counters[sid] = self.counters.get(sid, 0) + int(args["count"])
        return resp

    async def get_counter_value(self, request: web.Request) -> web.Response:
        sid = self._session(request)
        return self._reply(request, {"count": self.counters.get(sid or "", 0)})[0]

    async def verify(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        fault = self.faults.get("verify", "")
        if fault == "hang":
            await self.release.wait()
        if fault == "500":
            return web.Response(status=500, text="Internal Server Error")
        if fault == "garbage":
            return web.Response(status=200, text="<html>oops", content_type="text/html")
        sid = self._session(request)
        count = self.counters.get(sid or "", 0)
        out = body | {"extracted_answer": count} | self.verify_extra
        if fault != "no_reward":
            out["reward"] = 1.0 if count == body.get("expected_count") else 0.0
        out["reward_components"] = {"count_ok": out.get("reward", 0.0)}
        return self._reply(request, out)[0]

    async def close_session(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.closed.append(str(body.get("resources_session_id")))
        return self._reply(request, {"resources_session_id": body.get("resources_session_id")})[0]

    async def openapi(self, request: web.Request) -> web.Response:
        count = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
        paths: dict[str, Any] = {
            "/seed_session": {"post": {}},
            "/verify": {"post": {}},
            "/close_session": {"post": {}},
            "/increment_counter": {
                "post": {
                    "summary": "Increment Counter",
                    "requestBody": {
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Inc"}}}
                    },
                }
            },
            "/get_counter_value": {"post": {"summary": "Get Counter Value"}},
        }
        if self.reverify_mode is not None:
            paths["/reverify_mode"] = {"get": {}}
        return web.json_response(
            {"openapi": "3.1.0", "paths": paths, "components": {"schemas": {"Inc": count}}}
        )

    async def alive(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def mode(self, request: web.Request) -> web.Response:
        return web.json_response(self.reverify_mode)

    async def unknown(self, request: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self.alive)
        app.router.add_get("/openapi.json", self.openapi)
        app.router.add_get("/reverify_mode", self.mode)
        app.router.add_post("/seed_session", self.seed)
        app.router.add_post("/increment_counter", self.increment_counter)
        app.router.add_post("/get_counter_value", self.get_counter_value)
        app.router.add_post("/verify", self.verify)
        app.router.add_post("/close_session", self.close_session)
        app.router.add_post("/{name}", self.unknown)
        return app


@asynccontextmanager
async def fake_gym(gym: FakeGym, port: int = 0) -> AsyncIterator[str]:
    async with serve_app(gym.app(), port) as origin:
        try:
            yield origin
        finally:
            gym.release.set()


def counter_row(initial: int, expected: int) -> dict[str, Any]:
    """A row as NeMo Gym records it: materialized params with null fields."""
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": "add", "type": "message"}],
            "temperature": None,
            "tools": [{"type": "function", "name": "increment_counter", "parameters": {"type": "object"}}],
        },
        "initial_count": initial,
        "expected_count": expected,
    }


def as_json(row: dict[str, Any]) -> str:
    return json.dumps(row)


@dataclass
class EpisodeGym:
    """An episode server as NeMo Gym's aviary and toolsandbox servers are (their rows have an empty
    `input`): /seed_session answers `env_id`, the first observation `obs` and the session's `tools`;
    /step takes `env_id` and the turn's calls (`action`), answers `obs`, `reward`, `done`; /close
    scores the episode; /verify answers the episode's reward by `response.env_id`. Task `task_idx` is
    "what is A + B" (A, B = idx, idx + 2): `add` answers the sum, `submit_answer` ends the episode."""

    episodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)  # the protocol calls, in order

    async def seed(self, request: web.Request) -> web.Response:
        row = await request.json()
        self.calls.append("seed_session")
        idx = int(row["task_idx"])
        env_id = uuid.uuid4().hex
        self.episodes[env_id] = {"a": idx, "b": idx + 2, "total": 0.0, "closed": False, "scored": None}
        tool = {"type": "function", "strict": True, "description": "", "parameters": {"type": "object"}}
        return web.json_response(
            {
                "env_id": env_id,
                "obs": [
                    {"role": "system", "content": "Use the tools."},
                    {"role": "user", "content": f"What is {idx} + {idx + 2}?"},
                ],
                "tools": [tool | {"name": "add"}, tool | {"name": "submit_answer"}],
            }
        )

    async def step(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append("step")
        ep = self.episodes[body["env_id"]]
        obs: list[dict[str, Any]] = []
        reward, done = 0.0, False
        for call in body["action"]:
            args = json.loads(call["arguments"])
            if call["name"] == "add":
                out = str(int(args["a"]) + int(args["b"]))
            else:
                reward, done = float(str(args.get("answer")) == str(ep["a"] + ep["b"])), True
                out = "submitted"
            obs.append({"type": "function_call_output", "call_id": call["call_id"], "output": out})
        if not body["action"]:
            obs.append({"role": "user", "content": "Call a tool."})
        ep["total"] += reward
        return web.json_response({"obs": obs, "reward": reward, "done": done})

    async def close(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append("close")
        ep = self.episodes[body["env_id"]]
        ep["closed"], ep["scored"] = True, ep["total"]  # toolsandbox scores here
        return web.json_response({"message": "Success", "success": True})

    async def verify(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append("verify")
        ep = self.episodes[body["response"]["env_id"]]
        if not ep["closed"]:
            return web.json_response({"detail": "verify before close"}, status=500)
        return web.json_response({**body, "reward": ep["scored"]})

    async def openapi(self, request: web.Request) -> web.Response:
        paths = {f"/{p}": {"post": {}} for p in ("seed_session", "step", "close", "verify")}
        return web.json_response({"openapi": "3.1.0", "paths": paths})

    async def alive(self, request: web.Request) -> web.Response:
        return web.json_response({})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self.alive)
        app.router.add_get("/openapi.json", self.openapi)
        app.router.add_post("/seed_session", self.seed)
        app.router.add_post("/step", self.step)
        app.router.add_post("/close", self.close)
        app.router.add_post("/verify", self.verify)
        return app
