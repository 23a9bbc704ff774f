"""Shared pieces of the scheduler benchmarks: subprocess servers that report their port, the fake
gateway/verifier server role, RSS sampling and the environment block of the JSON report."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.fakes

from bench._meta import env_info as _env_info  # noqa: E402


def env_info() -> dict[str, Any]:
    return _env_info("grpcio", "protobuf", "rollmesh")


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MB of a process, from /proc."""
    cur = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (load-independent cost)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@asynccontextmanager
async def spawn(
    args: list[str], *, env: dict[str, str] | None = None, name: str = "server", start_timeout_s: float = 90
) -> AsyncIterator[tuple[int, str]]:
    """Run a server that writes its address to ROLLMESH_PORT_FILE; yields (pid, address)."""
    from rollmesh.mesh.server import wait_serving

    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        log_path = Path(tmp) / f"{name}.log"
        with log_path.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *args,
                env={
                    **os.environ,
                    **(env or {}),
                    "ROLLMESH_PORT_FILE": str(port_file),
                    "ROLLMESH_LOG_LEVEL": "warning",
                    "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                },
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                cwd=tmp,
            )
        try:
            async with asyncio.timeout(start_timeout_s):
                while not port_file.exists():
                    if proc.returncode is not None:
                        raise RuntimeError(f"{name} exited:\n{log_path.read_text()[-3000:]}")
                    await asyncio.sleep(0.05)
            address = port_file.read_text().strip()
            await wait_serving(address, timeout_s=60)
            yield proc.pid, address
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    async with asyncio.timeout(10):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


def fakes_args(latency_s: float) -> list[str]:
    return [sys.executable, "-m", "bench._scheduler_common", "--latency", str(latency_s)]


async def _serve_fakes(latency_s: float) -> None:
    from rollmesh.mesh.config import ServerConfig
    from rollmesh.mesh.logging import configure
    from rollmesh.mesh.server import serve
    from tests.fakes import FakeGateway, FakeVerifier

    configure("warning")
    fakes = [FakeGateway(latency_s=latency_s).binding(), FakeVerifier().binding()]
    await serve(fakes, ServerConfig(host="127.0.0.1", port=0, grace_seconds=0))


if __name__ == "__main__":  # the fakes server role: python -m bench._scheduler_common --latency S
    asyncio.run(_serve_fakes(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
