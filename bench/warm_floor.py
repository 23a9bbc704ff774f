"""The least CPU a warm-started rollout costs on this host, part by part: a fresh process forked
from an interpreter that has imported the openai SDK, confined as a warm rollout is (its network,
mount and pid namespaces, its init), running examples/agents/tool_loop.py's loop (3 chat calls,
2 tool calls) against a stub server on loopback. Prints one JSON object.

Each part is the median over `--n` runs of the CPU (user + system) of the processes it takes, the
forking interpreter's share included; the namespaces' parts are the same run less a plain fork's.
The interpreter has done what mesh/_warm.py does before forking (the program's imports, the modules
a first rollout imported, mesh/_warm_ahead.py's spares and models). What the kernel's workers spend
tearing a network namespace down (~1 ms each on this host) is in no part.

- `fork`: fork and exit of that interpreter;
- `network_namespace`, `mount_namespace` (as root: mesh/_confine.py's mounts in a copy of the
  interpreter's, which has made its own), `pid_namespace` (the interpreter makes it, the process is
  its init and forks the program, as mesh/_warm.py does);
- `confined` (as root): the whole of a warm rollout's confinement (mesh/_confine.py `enter` with a
  uid, in a pid namespace made by the interpreter), the program doing nothing;
- `sdk_first_loop`: the loop in a fresh fork (a new `OpenAI()` client and its first calls in that
  process: its pages copied, its caches filled);
- `sdk_loop_again`: the same loop run again, with the same client, in a process that ran it once
  (what an agent server's program pays per rollout);
- `floor`: `confined` + `sdk_loop_again` (or fork + the namespaces without root).

    python bench/warm_floor.py [--n 40]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench._meta import env_info  # noqa: E402
from bench._meta import result_stream  # noqa: E402

MESH = REPO / "services/rollmesh/mesh"
STUB = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path.endswith("/call"):
            out = {"output": "1", "is_error": False}
        else:  # the counter: increment, read, answer
            n = sum(1 for m in body["messages"] if m["role"] == "tool")
            name = ("increment_counter", "get_counter_value")[min(n, 1)]
            call = {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": "{}"}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            if n >= 2:
                message = {"role": "assistant", "content": "1"}
            choice = {"index": 0, "message": message, "finish_reason": "stop" if n >= 2 else "tool_calls"}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            out = {"id": "c", "object": "chat.completion", "created": 0, "model": "policy",
                   "choices": [choice], "usage": usage}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
TOOL = {"type": "function", "function": {"name": "increment_counter", "parameters": {"type": "object"}}}


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_floor{name}", MESH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu_ms(usage: resource.struct_rusage) -> float:
    return (usage.ru_utime + usage.ru_stime) * 1e3


def _forked(child: Callable[[], None], before: Callable[[], Any] | None = None) -> float:
    """CPU ms of one fork running `child` (then exit): the child's, with what it reaped, and this
    process's in the fork (`before` runs first here, `after` its result's close)."""
    own = _cpu_ms(resource.getrusage(resource.RUSAGE_SELF))
    made = before() if before is not None else None
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            child()
        except BaseException:
            code = 1
        os._exit(code)
    forking = _cpu_ms(resource.getrusage(resource.RUSAGE_SELF)) - own
    if made is not None:
        made()
    _, status, usage = os.wait4(pid, 0)
    if status != 0:
        raise SystemExit(f"a measured child failed (status {status})")
    return forking + _cpu_ms(usage)


def _median(n: int, run: Callable[[], float]) -> float:
    return statistics.median(run() for _ in range(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=40, help="runs per part")
    args = parser.parse_args()
    out_stream = result_stream()
    load_before = os.getloadavg()
    confine, ahead_module = _load("_confine"), _load("_warm_ahead")
    sys.path.insert(0, str(REPO / "examples/agents"))
    import tool_loop  # type: ignore[import-not-found]  # (the program's imports, made ahead)
    from openai import OpenAI

    stub = subprocess.Popen([sys.executable, "-c", STUB], stdout=subprocess.PIPE, text=True)
    try:
        assert stub.stdout is not None
        port = int(stub.stdout.readline())
        base = f"http://127.0.0.1:{port}"
        task = {"messages": [{"role": "user", "content": "count"}], "tools": [TOOL], "max_steps": 8}
        task["tools_url"] = base + "/tools"
        os.environ.update(OPENAI_BASE_URL=base + "/v1", OPENAI_API_KEY="k")

        def loop() -> None:
            tool_loop.run_loop(OpenAI(max_retries=0), task)

        # A first rollout's late imports, imported here as the warm interpreter learns them.
        fd, name = tempfile.mkstemp(suffix=".warm-floor")
        os.close(fd)
        report = Path(name)
        before = set(sys.modules)

        def first() -> None:
            loop()
            report.write_text("\n".join(n for n in sys.modules if n not in before))

        _forked(first)
        for name in report.read_text().split():
            try:
                __import__(name)
            except Exception:
                pass
        ahead = ahead_module.Ahead()
        ahead.prepare()
        gc.collect()
        gc.freeze()

        def again() -> None:
            client = OpenAI(max_retries=0)
            tool_loop.run_loop(client, task)
            t0 = _cpu_ms(resource.getrusage(resource.RUSAGE_SELF))
            tool_loop.run_loop(client, task)
            report.write_text(str(_cpu_ms(resource.getrusage(resource.RUSAGE_SELF)) - t0))

        def loop_again() -> float:
            _forked(again)
            return float(report.read_text())

        parts: dict[str, float] = {
            "fork": _median(args.n, lambda: _forked(lambda: None)),
            "sdk_first_loop": _median(args.n, lambda: _forked(loop)),
            "sdk_loop_again": _median(args.n, loop_again),
        }
        parts["sdk_first_loop"] -= parts["fork"]
        parts["network_namespace"] = (
            _median(args.n, lambda: _forked(lambda: confine._isolate([]))) - parts["fork"]
        )
        root = os.geteuid() == 0
        if root:
            parts.update(_confined(args.n, confine, parts["fork"]))
        floor = parts["confined"] if root else parts["fork"] + parts["network_namespace"]
        parts["floor"] = floor + parts["sdk_loop_again"]
    finally:
        stub.kill()
        stub.wait()
    out = {
        "bench": "warm_floor",
        "n": args.n,
        "as_root": os.geteuid() == 0,
        "cpu_ms": {k: round(v, 2) for k, v in parts.items()},
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        **env_info("openai"),
    }
    out_stream.write(json.dumps(out) + "\n")


def _confined(n: int, confine: ModuleType, fork_ms: float) -> dict[str, float]:
    """The namespaces a warm rollout takes as root, measured in a child that makes itself a mount
    namespace as the warm interpreter's is (the folder made for it is removed after, from here)."""
    writable = tempfile.mkdtemp(prefix="warm-floor-")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            result: dict[str, Any] = _confined_here(n, confine, fork_ms, writable)
        except BaseException as exc:
            result, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
        os.write(write, json.dumps(result).encode())
        os._exit(code)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    shutil.rmtree(writable, ignore_errors=True)
    parts = json.loads(data)
    if "error" in parts:
        raise SystemExit(f"the confined parts failed: {parts['error']}")
    return {k: float(v) for k, v in parts.items()}


def _confined_here(n: int, confine: ModuleType, fork_ms: float, writable: str) -> dict[str, float]:
    os.chmod(writable, 0o711)
    own = [os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, str(MESH), str(REPO)]
    readable = [*own, *filter(os.path.isabs, sys.path)]
    interpreter = {"readable": readable, "writable": [writable], "scratch_mb": 64}
    if not confine._private_mounts(interpreter):
        raise SystemExit("no mount namespace could be made")
    work = Path(writable) / "work"
    work.mkdir()
    os.chown(work, 65533, 65533)
    rollout = {"readable": readable, "writable": [str(work)], "scratch_mb": 64}
    own_pid = os.open("/proc/self/ns/pid", os.O_RDONLY)

    def new_pid_namespace() -> Callable[[], None]:
        if not confine._unshare(confine._CLONE_NEWPID):
            raise SystemExit("no pid namespace could be made")
        return lambda: confine._libc().setns(own_pid, confine._CLONE_NEWPID)

    def init_and_program() -> None:
        program = os.fork()
        if program == 0:
            os._exit(0)
        os.waitpid(program, 0)

    def enter() -> None:
        report = os.pipe()
        settings = {**rollout, "uid": 65533, "network": {"forward": []}, "rlimits": {}}
        confine.enter(settings, report[1])  # (the init exits in there; the program comes back)
        os._exit(0)

    parts = {
        "mount_namespace": _median(n, lambda: _forked(lambda: confine._private_mounts(rollout))) - fork_ms,
        "pid_namespace": _median(n, lambda: _forked(init_and_program, new_pid_namespace)) - fork_ms,
        "confined": _median(n, lambda: _forked(enter, new_pid_namespace)),
    }
    return parts


if __name__ == "__main__":
    main()
