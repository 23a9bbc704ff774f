"""`rollmesh up`: every service as its own process (`rollmesh serve <service>`), started in
dependency order, each waited on through its port file and the health service, their logs
interleaved on stderr with a prefix; SIGINT/SIGTERM stops them all (SIGTERM, then a grace)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rollmesh.mesh import config
from rollmesh.mesh.config import DEFAULT_PORTS
from rollmesh.mesh.lines import LineAssembler
from rollmesh.mesh.server import wait_serving

ORDER = ("registry", "verifier", "gateway", "scheduler")


@dataclass(frozen=True)
class UpConfig:
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    gateway_args: tuple[str, ...] = ()
    scheduler_args: tuple[str, ...] = ()
    start_timeout_s: float = 600.0
    grace_s: float = 15.0
    max_line_bytes: int = field(default_factory=lambda: int(config.read("ROLLMESH_LOG_MAX_LINE_BYTES")))


@dataclass
class Child:
    service: str
    proc: asyncio.subprocess.Process
    address: str = ""
    pump: asyncio.Task[None] | None = None


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "rollmesh"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "rollmesh.cli"]


async def pump_lines(
    prefix: str, stream: asyncio.StreamReader, write: Callable[[str], None], max_line_bytes: int
) -> None:
    """Copy `stream` to `write` line by line with `prefix`, lines of any length (capped, marked)."""
    lines = LineAssembler(max_line_bytes)
    while chunk := await stream.read(1 << 16):
        for line in lines.feed(chunk):
            write(f"{prefix}{line}")
    for line in lines.finish():
        write(f"{prefix}{line}")


async def _wait_port_file(path: Path, child: Child, deadline: float) -> str:
    loop = asyncio.get_running_loop()
    while not await asyncio.to_thread(path.exists):
        if child.proc.returncode is not None:
            raise RuntimeError(f"{child.service} exited with code {child.proc.returncode} before serving")
        if loop.time() > deadline:
            raise TimeoutError(f"{child.service} did not start in time")
        await asyncio.sleep(0.1)
    return (await asyncio.to_thread(path.read_text)).strip()


class Mesh:
    """The running children; `stop()` ends them in reverse order."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    @property
    def addresses(self) -> dict[str, str]:
        return {c.service: c.address for c in self.children}

    async def stop(self, grace_s: float) -> None:
        for child in reversed(self.children):
            if child.proc.returncode is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            try:
                await asyncio.wait_for(child.proc.wait(), grace_s)
            except TimeoutError:
                child.proc.kill()
                await child.proc.wait()
            if child.pump is not None:
                await asyncio.gather(child.pump, return_exceptions=True)


async def start_mesh(cfg: UpConfig, write: Callable[[str], None], mesh: Mesh) -> None:
    """Start every service in ORDER, each once the previous is SERVING; fills `mesh` as it goes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cfg.start_timeout_s
    env = dict(os.environ)
    extra_args: dict[str, Sequence[str]] = {"gateway": cfg.gateway_args, "scheduler": cfg.scheduler_args}
    with tempfile.TemporaryDirectory(prefix="rollmesh-up-") as tmp:
        for service in ORDER:
            port_file = Path(tmp) / f"{service}.addr"
            args = [*_cli(), "serve", service, "--port", str(cfg.ports[service]), "--host", cfg.host]
            args += list(extra_args.get(service, ()))
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**env, "ROLLMESH_PORT_FILE": str(port_file)},
                start_new_session=True,
            )
            child = Child(service, proc)
            assert proc.stdout is not None
            child.pump = asyncio.create_task(
                pump_lines(f"[{service}] ", proc.stdout, write, cfg.max_line_bytes)
            )
            mesh.children.append(child)
            bound = await _wait_port_file(port_file, child, deadline)
            host, _, port = bound.rpartition(":")
            child.address = f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
            await wait_serving(child.address, timeout_s=max(deadline - loop.time(), 1.0))
            env[f"ROLLMESH_{service.upper()}_ADDR"] = child.address
            write(f"[up] {service} serving on {child.address}")
