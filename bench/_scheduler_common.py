"""Shared pieces of the scheduler benchmarks: subprocess servers that report their port, the fake
gateway/verifier server role, RSS sampling and the environment block of the JSON report."""

from __future__ import annotations

import asyncio
import json
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


SERVICES = ("registry", "verifier", "gateway", "scheduler")


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except OSError:  # the thread ended since the listing
            continue
        out += [int(x) for x in text]
    return out


def service_pids(up_pid: int) -> dict[str, int]:
    """Each service's pid among `rollmesh up`'s children (by their `serve <service>` command line)."""
    found: dict[str, int] = {}
    for child in children_of(up_pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for service in SERVICES:
            if service.encode() in argv and b"serve" in argv:
                found[service] = child
    return found


@asynccontextmanager
async def mesh_up(
    output_dir: Path, *backend_args: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[dict[str, str], dict[str, int]]]:
    """`rollmesh up --ephemeral --json BACKEND_ARGS...` (every service its own process); yields
    (addresses, pids by service)."""
    exe = Path(sys.executable).parent / "rollmesh"
    args = [
        str(exe),
        "up",
        "--ephemeral",
        "--json",
        *backend_args,
        "--http-port",
        "-1",
        "--output-dir",
        str(output_dir),
    ]
    env = {**os.environ, "ROLLMESH_LOG_LEVEL": "warning", **(env or {})}
    log_path = output_dir / "up.log"
    with log_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=err, env=env, start_new_session=True
        )
    try:
        assert proc.stdout is not None
        text = ""
        async with asyncio.timeout(300):
            while True:  # the addresses, as one (maybe indented) JSON object
                line = await proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"rollmesh up exited:\n{log_path.read_text()[-3000:]}")
                text += line.decode()
                try:
                    addresses = json.loads(text)
                    break
                except ValueError:
                    continue
        pids = service_pids(proc.pid)
        log(f"mesh up: {addresses} pids {pids}")
        yield addresses, pids
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(30):
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
    from tests.fakes import FakeGateway
    from tests.fakes import FakeVerifier

    configure("warning")
    fakes = [FakeGateway(latency_s=latency_s).binding(), FakeVerifier().binding()]
    await serve(fakes, ServerConfig(host="127.0.0.1", port=0, grace_seconds=0))


if __name__ == "__main__":  # the fakes server role: python -m bench._scheduler_common --latency S
    asyncio.run(_serve_fakes(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
