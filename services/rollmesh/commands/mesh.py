"""`rollmesh up` (every service as its own process, in the foreground) and `rollmesh status`."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Annotated

import typer

from rollmesh.commands._common import (
    ApiKey,
    GatewayAddr,
    JsonOut,
    RegistryAddr,
    SchedulerAddr,
    VerifierAddr,
    err,
    fail,
    print_json,
    print_table,
    run,
)


def up(
    host: Annotated[
        str, typer.Option("--host", help="Host every service binds (0.0.0.0: all interfaces).")
    ] = "127.0.0.1",
    ephemeral: Annotated[
        bool, typer.Option("--ephemeral", help="Bind free ports instead of 50051-50054 (printed when ready).")
    ] = False,
    backend: Annotated[
        str, typer.Option("--backend", help="Gateway backend: ray-serve, openai or fake.")
    ] = "",
    model: Annotated[str, typer.Option("--model", help="Gateway model (default tiny-arith).")] = "",
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="Data-parallel vLLM replicas.")] = 1,
    base_url: Annotated[str, typer.Option("--base-url", help="OpenAI-compatible URL (openai backend).")] = "",
    http_port: Annotated[
        int, typer.Option("--http-port", help="Gateway's OpenAI HTTP port (-1: off).")
    ] = 8000,
    output_dir: Annotated[
        str, typer.Option("--output-dir", help="Scheduler's JSONL output folder.")
    ] = "runs",
    as_json: JsonOut = False,
) -> None:
    """Start registry, verifier, gateway (with Ray Serve replicas) and scheduler as separate processes,
    stay in the foreground with their logs; Ctrl-C stops them all."""
    from rollmesh.launch.processes import Mesh, UpConfig, start_mesh
    from rollmesh.mesh.config import DEFAULT_PORTS
    from rollmesh.mesh.lines import LineWriter

    ports = {s: 0 for s in DEFAULT_PORTS} if ephemeral else dict(DEFAULT_PORTS)
    gateway_args = [
        "--replicas",
        str(replicas),
        "--http-port",
        str(0 if ephemeral and http_port >= 0 else http_port),
    ]
    for flag, value in (("--backend", backend), ("--model", model), ("--base-url", base_url)):
        if value:
            gateway_args += [flag, value]
    cfg = UpConfig(
        host=host, ports=ports, gateway_args=tuple(gateway_args), scheduler_args=("--output-dir", output_dir)
    )

    # Children's lines reach stderr through a queue and a thread: a slow terminal or a full pipe
    # drops (and counts) lines, it never stalls the loop that reads the children and handles signals.
    out_lines = LineWriter(
        sys.stderr, drop_notice=lambda n: f"[up] {n} log lines dropped: stderr was not keeping up"
    )
    write = out_lines.write

    async def go() -> int:
        mesh = Mesh()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        starter = asyncio.ensure_future(start_mesh(cfg, write, mesh))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({starter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if starter.done() and starter.exception() is None:
                if as_json:
                    print_json(mesh.addresses)
                else:
                    print_table(
                        "rollmesh is up (Ctrl-C stops)", ["service", "address"], list(mesh.addresses.items())
                    )
                await _watch(mesh, stop)
            elif starter.done():
                write(f"[up] failed to start: {starter.exception()}")
                return 1
            return 0
        finally:
            starter.cancel()
            stopper.cancel()
            write("[up] stopping")
            await mesh.stop(cfg.grace_s)

    try:
        code = run(go())
    finally:
        out_lines.close(timeout_s=5.0)
    raise typer.Exit(code)


async def _watch(mesh: object, stop: asyncio.Event) -> None:
    """Return when asked to stop or when any child dies (then the rest are stopped too)."""
    from rollmesh.launch.processes import Mesh

    assert isinstance(mesh, Mesh)
    waits = [asyncio.ensure_future(c.proc.wait()) for c in mesh.children]
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({*waits, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for w in [*waits, stopper]:
        w.cancel()
    for child in mesh.children:
        if child.proc.returncode is not None and stopper not in done:
            err.print(f"[up] {child.service} exited with code {child.proc.returncode}; stopping the mesh")


def status(
    registry: RegistryAddr = "",
    verifier: VerifierAddr = "",
    gateway: GatewayAddr = "",
    scheduler: SchedulerAddr = "",
    api_key: ApiKey = "",
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds per check.")] = 3.0,
    as_json: JsonOut = False,
) -> None:
    """Each service's address and health, with replicas for the gateway. Exit 1 if any is down."""
    from rollmesh.launch.status import mesh_status
    from rollmesh.mesh.config import service_addr

    given = {"registry": registry, "verifier": verifier, "gateway": gateway, "scheduler": scheduler}
    addrs = {svc: addr or service_addr(svc) for svc, addr in given.items()}
    statuses = run(mesh_status(addrs, api_key=api_key or None, timeout_s=timeout_s))
    if as_json:
        print_json(
            [
                {
                    "service": s.service,
                    "address": s.address,
                    "health": s.health,
                    "detail": s.detail,
                    "ok": s.ok,
                    "replicas": s.replicas,
                }
                for s in statuses
            ]
        )
    else:
        print_table(
            "rollmesh status",
            ["service", "address", "health", "detail"],
            [(s.service, s.address, s.health, s.detail) for s in statuses],
        )
    if not all(s.ok for s in statuses):
        down = ", ".join(s.service for s in statuses if not s.ok and s.readable)
        unreadable = ", ".join(s.service for s in statuses if not s.readable)
        if not as_json:
            if unreadable:
                fail(f"cannot read: {unreadable} (check --api-key / ROLLMESH_API_KEY)", code=1)
            fail(f"not serving: {down} (start the mesh with `rollmesh up`)", code=1)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("status")(status)
