"""tool_loop.py's chat tool loop as an agent server (no rollmesh import): one process serving every
rollout of a job:

    rollmesh run --agent-mode server --agent-program "python examples/agents/tool_loop_server.py" ...


It serves HTTP on 127.0.0.1:$ROLLMESH_AGENT_PORT. Per rollout rollmesh sends `POST /run` with the
task document a per-rollout program gets (messages, tools, task, max_steps, tools_url) plus the
rollout's own `base_url` and `api_key`: every model call through them is recorded into that
rollout's token record. It answers `{}` when the loop is done (the last model call holds the answer;
`{"answer": "..."}` would add one to verify). Requests run at once, one thread each, on one shared
HTTP connection pool.
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

import httpx2
from openai import DefaultHttpxClient
from openai import OpenAI
from tool_loop import run_loop

# One pool of kept-alive connections for every rollout's model and tool calls.
POOL = DefaultHttpxClient(
    timeout=600.0, limits=httpx2.Limits(max_connections=1024, max_keepalive_connections=256)
)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # a reply's headers and body are two writes: send both at once

    def do_GET(self) -> None:  # rollmesh's "is it up?"
        self._reply(200, {"ok": True})

    def do_POST(self) -> None:
        if self.path != "/run":
            self._reply(404, {"error": f"no {self.path}"})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        # A connection dropped under load is tried again by the SDK (should the gateway have answered
        # the call it carried, the retry is recorded as one more call, in a segment of its own).
        client = OpenAI(base_url=body["base_url"], api_key=body["api_key"], max_retries=2, http_client=POOL)
        try:
            run_loop(client, body, POOL)
        except Exception as exc:  # the rollout's failure, not the server's: rollmesh names it
            self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        self._reply(200, {})

    def _reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a line per request is noise in the row's output


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # rollmesh opens a connection per rollout in flight, many at once: with the default listen
    # backlog (5) the kernel drops the rest, and each is tried again only a second later.
    request_queue_size = 1024


if __name__ == "__main__":
    # A thread per request, each mostly waiting on the network: hand the interpreter's lock on
    # sooner than every 5 ms, or each answered call waits for it behind the others.
    sys.setswitchinterval(0.0005)
    Server(("127.0.0.1", int(os.environ["ROLLMESH_AGENT_PORT"])), Handler).serve_forever()
