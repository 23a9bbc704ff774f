"""`rollmesh up`: every service as its own process (`rollmesh serve <service>`), supervised.

- Start: services start in dependency order (ORDER), each waited on through its port file and
  the health service before the next starts; each later one gets the earlier ones' addresses.
  A child that dies before it serves fails the start (`up` exits 1).
- Logs: each child's stdout+stderr is read in chunks and written line by line with a
  `[service] ` prefix; lines of any length are cut with a marker (mesh/lines.py).
- Supervision: a child that dies is logged with its pid and exit code or signal, and restarted
  per the RestartPolicy (launch/restart.py) on the port it had, so every address stays valid.
  Before a restart the child's process group is killed (no orphaned grandchildren). When the
  policy says no restart, or the restart budget is spent, the mesh stops and `supervise`
  returns 1.
- Metrics: with `UpConfig.metrics_ports`, each child serves Prometheus metrics on its port (0: a free
  one, which it reports next to its port file: mesh/metrics.py `metrics_file`); a restarted child
  gets the port it had, so scrape targets stay valid, and its restarts so far (ROLLMESH_RESTARTS),
  which it exports as `rollmesh_service_restarts_total{service}`.
- Stop: SIGTERM to every running child at once; any still running after `grace_s` (or at once
  when `force` is set, e.g. by a second Ctrl-C) is SIGKILLed with its whole process group.
- `up` itself killed (SIGKILL, OOM): on Linux every child gets SIGTERM from the kernel
  (PR_SET_PDEATHSIG, set between fork and exec) and drains as on a normal stop, so no service
  outlives `up`. Elsewhere a SIGKILLed `up` leaves its children running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh.launch.restart import RestartBudget
from rollmesh.launch.restart import RestartPolicy
from rollmesh.launch.restart import describe_exit
from rollmesh.mesh import config
from rollmesh.mesh.aio import first_of
from rollmesh.mesh.children import kill_group
from rollmesh.mesh.config import DEFAULT_PORTS
from rollmesh.mesh.confine import Confinement
from rollmesh.mesh.confine import command
from rollmesh.mesh.lines import LineAssembler
from rollmesh.mesh.metrics import metrics_file
from rollmesh.mesh.server import wait_serving

ORDER = ("registry", "verifier", "gateway", "scheduler")


@dataclass(frozen=True)
class UpConfig:
    host: str = "127.0.0.1"
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    gateway_args: tuple[str, ...] = ()
    scheduler_args: tuple[str, ...] = ()
    metrics_ports: dict[str, int] | None = None  # None: no metrics endpoints
    start_timeout_s: float = 600.0
    grace_s: float = 15.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    max_line_bytes: int = field(default_factory=lambda: int(config.read("ROLLMESH_LOG_MAX_LINE_BYTES")))
    env: dict[str, str] = field(default_factory=dict)  # every child's, over the inherited environment


@dataclass
class Child:
    service: str
    proc: asyncio.subprocess.Process
    budget: RestartBudget
    address: str = ""
    metrics_address: str = ""
    pump: asyncio.Task[None] | None = None
    restarts: int = 0  # each restart's child gets it (ROLLMESH_RESTARTS) and exports it


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


def _reachable(bound: str) -> str:
    """A bound host:port as an address to call (0.0.0.0 is reached on loopback)."""
    host, _, port = bound.strip().rpartition(":")
    return f"{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"


class Mesh:
    """The supervised children: `start()`, then `supervise(stop)`, and always `stop()`."""

    def __init__(self, cfg: UpConfig, write: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.write = write
        self.children: list[Child] = []
        self.env = {**os.environ, **cfg.env}
        self._tmp = tempfile.TemporaryDirectory(prefix="rollmesh-up-")

    @property
    def addresses(self) -> dict[str, str]:
        return {c.service: c.address for c in self.children}

    @property
    def metrics_addresses(self) -> dict[str, str]:
        """Each service's metrics endpoint host:port (empty without UpConfig.metrics_ports)."""
        return {c.service: c.metrics_address for c in self.children if c.metrics_address}

    async def start(self) -> None:
        """Start every service in ORDER, each once the previous is SERVING."""
        deadline = asyncio.get_running_loop().time() + self.cfg.start_timeout_s
        for service in ORDER:
            child = await self._spawn(service, self.cfg.ports[service], None)
            await self._wait_ready(child, deadline)

    async def _spawn(self, service: str, port: int, child: Child | None) -> Child:
        port_file = Path(self._tmp.name) / f"{service}.addr"
        port_file.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(metrics_file(str(port_file)))
        args = [*_cli(), "serve", service, "--port", str(port), "--host", self.cfg.host]
        args += {"gateway": self.cfg.gateway_args, "scheduler": self.cfg.scheduler_args}.get(service, ())
        if self.cfg.metrics_ports is not None:
            metrics_port = self.cfg.metrics_ports[service]
            if child is not None and child.metrics_address:  # a restart: the port it had
                metrics_port = int(child.metrics_address.rpartition(":")[2])
            args += ["--metrics-port", str(metrics_port)]
        # Through the wrapper for the parent's death signal, never a preexec_fn (which makes Python
        # fork, not vfork, and run every fork handler in the child: gRPC's included).
        args = command(args, Confinement(), port_file.with_suffix(".mode"))
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={
                **self.env,
                "ROLLMESH_PORT_FILE": str(port_file),
                "ROLLMESH_RESTARTS": str(child.restarts if child is not None else 0),
            },
            start_new_session=True,
        )
        if child is None:
            child = Child(service, proc, RestartBudget(self.cfg.restart))
            self.children.append(child)
        else:
            child.proc = proc
        assert proc.stdout is not None
        child.pump = asyncio.create_task(
            pump_lines(f"[{service}] ", proc.stdout, self.write, self.cfg.max_line_bytes)
        )
        return child

    async def _wait_ready(self, child: Child, deadline: float) -> None:
        port_file = Path(self._tmp.name) / f"{child.service}.addr"
        loop = asyncio.get_running_loop()
        while not await asyncio.to_thread(port_file.exists):
            if child.proc.returncode is not None:
                raise RuntimeError(f"{child.service} {describe_exit(child.proc.returncode)} before serving")
            if loop.time() > deadline:
                raise TimeoutError(f"{child.service} did not start in time")
            await asyncio.sleep(0.1)
        child.address = _reachable(await asyncio.to_thread(port_file.read_text))
        if self.cfg.metrics_ports is not None:
            metrics_path = Path(metrics_file(str(port_file)))
            child.metrics_address = _reachable(await asyncio.to_thread(metrics_path.read_text))
        timeout_s = max(deadline - loop.time(), 1.0)
        serving, _ = await first_of(wait_serving(child.address, timeout_s=timeout_s), child.proc.wait())
        if serving.cancelled():  # it died first
            raise RuntimeError(f"{child.service} {describe_exit(await child.proc.wait())} before serving")
        serving.result()
        self.env[f"ROLLMESH_{child.service.upper()}_ADDR"] = child.address
        metrics = f", metrics http://{child.metrics_address}/metrics" if child.metrics_address else ""
        self.write(f"[up] {child.service} serving on {child.address} (pid {child.proc.pid}{metrics})")

    async def supervise(self, stop: asyncio.Event) -> int:
        """Keep every child running until `stop` is set (returns 0) or one is given up on (returns 1)."""
        keepers = [asyncio.create_task(self._keep(c), name=f"keep-{c.service}") for c in self.children]
        stopper, *_ = await first_of(stop.wait(), *keepers)
        return 1 if stopper.cancelled() else 0

    async def _keep(self, child: Child) -> None:
        """Restart `child` whenever it dies; returns only when the policy gives up on it."""
        loop = asyncio.get_running_loop()
        policy = self.cfg.restart
        while True:
            pid = child.proc.pid
            code = await child.proc.wait()
            kill_group(child.proc)
            if child.pump is not None:
                await asyncio.gather(child.pump, return_exceptions=True)
            self.write(f"[up] {child.service} (pid {pid}) {describe_exit(code)}")
            if not policy.wants_restart(code):
                self.write(f"[up] restart policy {policy.mode!r}: not restarting {child.service}")
                return
            delay = child.budget.next_delay(loop.time())
            if delay is None:
                self.write(
                    f"[up] giving up on {child.service}: {policy.max_restarts} restarts within "
                    f"{policy.window_s:g} s"
                )
                return
            self.write(
                f"[up] restarting {child.service} in {delay:g} s "
                f"(restart {child.budget.used} of {policy.max_restarts} within {policy.window_s:g} s)"
            )
            await asyncio.sleep(delay)
            child.restarts += 1
            port = int(child.address.rpartition(":")[2])
            await self._spawn(child.service, port, child)
            try:
                await self._wait_ready(child, loop.time() + self.cfg.start_timeout_s)
            except (RuntimeError, TimeoutError, OSError) as exc:
                self.write(f"[up] {child.service} failed to come back: {exc}")
                if child.proc.returncode is None:
                    kill_group(child.proc)

    async def stop(self, grace_s: float, force: asyncio.Event | None = None) -> None:
        """SIGTERM every child at once; SIGKILL (whole group) what still runs after `grace_s` or `force`."""
        running = [c for c in self.children if c.proc.returncode is None]
        for child in reversed(running):
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
        waits: asyncio.Future[Any] = asyncio.gather(*(c.proc.wait() for c in running))
        forced: asyncio.Future[Any] = asyncio.ensure_future((force or asyncio.Event()).wait())
        try:
            await asyncio.wait([waits, forced], timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()
        for child in running:  # (a child that died earlier had its group killed then)
            if child.proc.returncode is None:
                self.write(f"[up] {child.service} (pid {child.proc.pid}) still running; killing it")
            kill_group(child.proc)  # also ends anything the child left behind in its group
        await asyncio.gather(*(c.proc.wait() for c in self.children), return_exceptions=True)
        waits.cancel()
        await asyncio.gather(waits, return_exceptions=True)
        await asyncio.gather(*(c.pump for c in self.children if c.pump is not None), return_exceptions=True)
        self._tmp.cleanup()
