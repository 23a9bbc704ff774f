"""A small OpenAI-compatible server of the project's own, for tests, fault injection and benchmarks.

Contract:
- `GET /v1/models` lists one model (`id`, `max_model_len` as vLLM reports it); `GET /v1/models/{id}`
  returns it (404 with an OpenAI error body for any other id).
- `POST /v1/chat/completions`, streaming (SSE, `data: [DONE]` last) and not. The answer to a last user
  message "What is A + B?" is "The answer is {A+B}."; to anything else, `FaultConfig.answer`. `usage`
  is always filled on a unary answer and on the last streamed chunk when `stream_options.include_usage`
  is set; tokens are counted as whitespace-separated words (prompt: every message's text).
  A request naming another model gets 404 (`model_not_found`).
- Faults (`FaultConfig`), decided per chat call from its 1-based number `n` (and a seeded RNG for
  rates), each fault's `Frequency` striking when its `every` divides `n` or with probability its
  `rate`, in this order: wait `latency_s`; then fail with the next of `fail_statuses` (`fail`; 429
  carries `Retry-After: retry_after_s`); else hang until the client goes away or the server stops
  (`hang`); else drop the connection (`drop`): a stream after its first chunk, a unary call before
  any byte of the response. Every answer ends with `finish_reason` (default "stop"; "" sends null and a
  stream with no chunk naming one); `send_done` false ends a stream without `data: [DONE]`.
- Control, for tests and benchmarks: `GET /_stats` (calls, in flight, peak in flight, outcomes) and
  `POST /_faults` (a FaultConfig as JSON replaces the current one and resets the call count).

In process: `async with OpenAITestServer(FaultConfig(...)) as server: server.base_url` (ends in `/v1`).
In a child process (its own CPU): `with openai_server_process(FaultConfig(...)) as (base_url, proc):`.
As a process: `python -m rollmesh.devtools.openai_server --port 0 --port-file F [--faults-json '{...}']`
writes HOST:PORT to F once listening; SIGTERM/SIGINT stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict
from dataclasses import dataclass
from dataclasses import field
from dataclasses import fields
from pathlib import Path
from typing import Any

from aiohttp import web

from rollmesh.mesh.aio import run_server
from rollmesh.mesh.aiohttp_serve import AiohttpServe
from rollmesh.mesh.chat import content_text
from rollmesh.mesh.server import write_port_file

_SUM = re.compile(r"What is\s+(-?\d+)\s*\+\s*(-?\d+)\s*\?")


def _checked(cls: type[Any], data: dict[str, Any]) -> dict[str, Any]:
    """`data` as keyword arguments of dataclass `cls`; a field it does not have is a ValueError."""
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}; known: {sorted(known)}")
    return dict(data)


@dataclass(frozen=True)
class Frequency:
    """How often a fault strikes: on every call whose number `every` divides, or with probability
    `rate` (drawn only when `every` did not strike). The default: never."""

    every: int = 0
    rate: float = 0.0

    def strikes(self, n: int, rng: random.Random) -> bool:
        return (self.every > 0 and n % self.every == 0) or (self.rate > 0 and rng.random() < self.rate)


@dataclass(frozen=True)
class FaultConfig:
    """What goes wrong, and how often. Every field's default means "never"."""

    latency_s: float = 0.0
    fail_statuses: tuple[int, ...] = ()
    fail: Frequency = Frequency()
    retry_after_s: float = 1.0
    hang: Frequency = Frequency()
    drop: Frequency = Frequency()
    answer: str = "ok"
    seed: int = 0
    finish_reason: str = "stop"  # what every answer says ("": null, as a server that names none)
    send_done: bool = True  # False: a stream ends (cleanly) after its last chunk, with no [DONE]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FaultConfig:
        values = _checked(cls, data)
        if "fail_statuses" in values:
            values["fail_statuses"] = tuple(int(s) for s in values["fail_statuses"])
        for name in ("fail", "hang", "drop"):
            if name in values:
                values[name] = Frequency(**_checked(Frequency, values[name]))
        return cls(**values)


@dataclass
class ServerStats:
    calls: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    # The last request bodies, newest last (tests check what a client sent).
    bodies: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=64))

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "outcomes": dict(self.outcomes),
        }


def answer_for(messages: list[dict[str, Any]], default: str) -> str:
    """The reply to the last user message: the sum for "What is A + B?", else `default`."""
    for m in reversed(messages):
        if m.get("role") == "user":
            found = _SUM.search(content_text(m.get("content")))
            if found:
                return f"The answer is {int(found.group(1)) + int(found.group(2))}."
            break
    return default


def _words(text: str) -> int:
    return len(text.split())


def _error(status: int, message: str, kind: str, code: str = "") -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": code or None, "param": None}}
    return web.json_response(body, status=status)


def _no_model(name: object, code: str = "") -> web.Response:
    return _error(404, f"The model `{name}` does not exist.", "NotFoundError", code)


class OpenAITestServer:
    """An aiohttp server answering the OpenAI chat API with injectable faults (see the module doc)."""

    def __init__(
        self,
        faults: FaultConfig | None = None,
        *,
        model: str = "tiny",
        max_model_len: int = 4096,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.faults = faults or FaultConfig()
        self.model = model
        self.max_model_len = max_model_len
        self.stats = ServerStats()
        self._host = host
        self._port = port
        self._rng = random.Random(self.faults.seed)
        self._stopping = asyncio.Event()
        self._serve = AiohttpServe()
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/v1"

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model_id:.+}", self._model)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/_stats", self._stats)
        app.router.add_post("/_faults", self._set_faults)
        options = {"access_log": None, "handle_signals": False, "shutdown_timeout": 1.0}
        self.port = await self._serve.start(app, self._host, self._port, backlog=4096, **options)

    async def stop(self) -> None:
        self._stopping.set()
        await self._serve.stop()

    async def __aenter__(self) -> OpenAITestServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def set_faults(self, faults: FaultConfig) -> None:
        """Replace the faults; the call count restarts so `every` counts from the next call."""
        self.faults = faults
        self._rng = random.Random(faults.seed)
        self.stats.calls = 0

    # -- control -----------------------------------------------------------------------------

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.to_json())

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            faults = FaultConfig.from_json(await request.json())
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc), "invalid_request_error")
        self.set_faults(faults)
        return web.json_response(asdict(faults))

    # -- models ------------------------------------------------------------------------------

    def _card(self) -> dict[str, Any]:
        return {
            "id": self.model,
            "object": "model",
            "created": 0,
            "owned_by": "rollmesh-devtools",
            "max_model_len": self.max_model_len,
        }

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def _model(self, request: web.Request) -> web.Response:
        if request.match_info["model_id"] != self.model:
            return _no_model(request.match_info["model_id"])
        return web.json_response(self._card())

    # -- chat --------------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.stats.calls += 1
        n = self.stats.calls
        faults = self.faults
        self.stats.in_flight += 1
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        try:
            body = await request.json()
            self.stats.bodies.append(body)
            if faults.latency_s > 0:
                await asyncio.sleep(faults.latency_s)
            if faults.fail_statuses and faults.fail.strikes(n, self._rng):
                status = faults.fail_statuses[(n - 1) % len(faults.fail_statuses)]
                self.stats.outcomes[f"fail_{status}"] += 1
                resp = _error(status, f"injected failure (HTTP {status}) on call {n}", "server_error")
                if status == 429:
                    resp.headers["Retry-After"] = f"{faults.retry_after_s:g}"
                return resp
            if faults.hang.strikes(n, self._rng):
                self.stats.outcomes["hang"] += 1
                await self._stopping.wait()
                raise ConnectionResetError("server stopping")
            drop = faults.drop.strikes(n, self._rng)
            if body.get("model") not in (None, "", self.model):
                self.stats.outcomes["model_not_found"] += 1
                return _no_model(body.get("model"), "model_not_found")
            if body.get("stream"):
                return await self._stream(request, body, drop)
            if drop:
                self.stats.outcomes["drop"] += 1
                _drop_connection(request)
                raise ConnectionResetError("dropped by fault injection")
            self.stats.outcomes["ok"] += 1
            return web.json_response(self._completion(body))
        finally:
            self.stats.in_flight -= 1

    def _usage(self, body: dict[str, Any], text: str) -> dict[str, int]:
        prompt = sum(_words(content_text(m.get("content"))) for m in body.get("messages") or [])
        completion = _words(text)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        text = answer_for(body.get("messages") or [], self.faults.answer)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": self.faults.finish_reason or None,
                    "logprobs": None,
                }
            ],
            "usage": self._usage(body, text),
        }

    async def _stream(self, request: web.Request, body: dict[str, Any], drop: bool) -> web.StreamResponse:
        text = answer_for(body.get("messages") or [], self.faults.answer)
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None, usage: dict[str, int] | None = None) -> bytes:
            choices = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
            obj: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "choices": choices if delta or finish else [],
            }
            if usage is not None:
                obj["usage"] = usage
            return f"data: {json.dumps(obj)}\n\n".encode()

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(chunk({"role": "assistant", "content": ""}, None))
        if drop:
            self.stats.outcomes["drop"] += 1
            _drop_connection(request)
            return resp
        words = text.split(" ")
        for i, word in enumerate(words):
            await resp.write(chunk({"content": word if i == 0 else " " + word}, None))
        if self.faults.finish_reason:
            await resp.write(chunk({}, self.faults.finish_reason))
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(chunk({}, None, self._usage(body, text)))
        if self.faults.send_done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.stats.outcomes["ok"] += 1
        return resp


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with OpenAITestServer(
        FaultConfig.from_json(json.loads(args.faults_json)),
        model=args.model,
        max_model_len=args.max_model_len,
        host=args.host,
        port=args.port,
    ) as server:
        if args.port_file:
            write_port_file(args.port_file, f"{args.host}:{server.port}")
        await stop.wait()


@contextlib.contextmanager
def openai_server_process(
    faults: FaultConfig | None = None,
    *,
    model: str = "tiny",
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run the server as a child process (its own CPU); yields `(base_url, process)` once it listens,
    and stops it (SIGTERM, then SIGKILL) on exit. For e2e tests and benchmarks; never call it from a
    running event loop (it polls with blocking sleeps)."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "addr"
        args = [sys.executable, "-m", "rollmesh.devtools.openai_server", "--port-file", str(port_file)]
        args += ["--model", model, "--faults-json", json.dumps(asdict(faults or FaultConfig()))]
        proc = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            while not port_file.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"the test OpenAI server exited with {proc.returncode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the test OpenAI server did not listen within {timeout_s} s")
                time.sleep(0.05)
            yield f"http://{port_file.read_text().strip()}/v1", proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m rollmesh.devtools.openai_server", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", default="", help="write HOST:PORT here once listening")
    p.add_argument("--model", default="tiny")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--faults-json", default="{}", help="a FaultConfig as JSON, e.g. '{\"latency_s\": 2}'")
    args = p.parse_args(argv)
    # uvloop when installed: the server should not be the bottleneck. CPython's collector settings,
    # as the benches' raw client loops have: this server is their common reference, not the mesh.
    run_server(_serve(args), gc_tuned=False)


if __name__ == "__main__":
    main()
