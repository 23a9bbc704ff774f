"""`rollmesh up` (every service as its own process, in the foreground) and `rollmesh status`."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Annotated

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import BaseUrl
from rollmesh.commands._common import GatewayAddr
from rollmesh.commands._common import JsonOut
from rollmesh.commands._common import OutputDir
from rollmesh.commands._common import RegistryAddr
from rollmesh.commands._common import SchedulerAddr
from rollmesh.commands._common import VerifierAddr
from rollmesh.commands._common import fail
from rollmesh.commands._common import print_json
from rollmesh.commands._common import print_table
from rollmesh.commands._common import run
from rollmesh.scheduler import DEFAULT_OUTPUT_DIR


def up(
    host: Annotated[
        str,
        typer.Option(
            "--host", envvar="ROLLMESH_BIND_HOST", help="Host every service binds (0.0.0.0: all interfaces)."
        ),
    ] = "127.0.0.1",
    ephemeral: Annotated[
        bool, typer.Option("--ephemeral", help="Bind free ports instead of 50051-50054 (printed when ready).")
    ] = False,
    backend: Annotated[
        str, typer.Option("--backend", help="Gateway backend: ray-serve, openai or fake.")
    ] = "",
    model: Annotated[str, typer.Option("--model", help="Gateway model (default tiny-arith).")] = "",
    # envvar=: up passes each to its child as a flag, which would otherwise override the variable.
    replicas: Annotated[
        int,
        typer.Option("--replicas", min=1, envvar="ROLLMESH_REPLICAS", help="Data-parallel vLLM replicas."),
    ] = 1,
    base_url: BaseUrl = "",
    http_port: Annotated[
        int,
        typer.Option(
            "--http-port", envvar="ROLLMESH_OPENAI_HTTP_PORT", help="Gateway's OpenAI HTTP port (-1: off)."
        ),
    ] = 8000,
    output_dir: OutputDir = DEFAULT_OUTPUT_DIR,
    restart: Annotated[
        str,
        typer.Option(
            "--restart",
            help="Restart a service that dies: no, on-failure or always "
            "(default: ROLLMESH_RESTART or on-failure).",
            show_default=False,
        ),
    ] = "",
    max_restarts: Annotated[
        int | None,
        typer.Option(
            "--max-restarts",
            min=0,
            help="Restarts of one service allowed within --restart-window, then up gives up and exits 1 "
            "(default: ROLLMESH_RESTART_MAX or 5).",
            show_default=False,
        ),
    ] = None,
    restart_window: Annotated[
        float | None,
        typer.Option(
            "--restart-window",
            min=0.001,
            help="Seconds --max-restarts counts over (default: ROLLMESH_RESTART_WINDOW_S or 300).",
            show_default=False,
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option("--grace", min=0.0, help="Seconds services get to stop on SIGTERM before SIGKILL."),
    ] = 15.0,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics",
            help="Each service serves Prometheus metrics at /metrics: ports 9461-9464 (registry, verifier,"
            ' gateway, scheduler), free ones with --ephemeral; listed when up (--json: under "metrics").',
        ),
    ] = False,
    as_json: JsonOut = False,
) -> None:
    """Start registry, verifier, gateway (with Ray Serve replicas) and scheduler as separate processes,
    stay in the foreground with their logs and restart a service that dies (--restart); Ctrl-C or
    SIGTERM stops them all (a second one kills at once). Exits 1 when a service cannot be kept up."""
    from rollmesh.launch.processes import Mesh
    from rollmesh.launch.processes import UpConfig
    from rollmesh.launch.restart import RestartPolicy
    from rollmesh.mesh.aio import first_of
    from rollmesh.mesh.config import DEFAULT_METRICS_PORTS
    from rollmesh.mesh.config import DEFAULT_PORTS
    from rollmesh.mesh.errors import ConfigError
    from rollmesh.mesh.lines import LineWriter
    from rollmesh.mesh.server import refuse_a_taken_port

    try:
        policy = RestartPolicy.from_env(
            mode=restart or None, max_restarts=max_restarts, window_s=restart_window
        )
    except ConfigError as exc:
        fail(str(exc))
    ports = {s: 0 for s in DEFAULT_PORTS} if ephemeral else dict(DEFAULT_PORTS)
    facade_port = 0 if ephemeral and http_port >= 0 else http_port
    wanted = {f"the {s}": f"{host}:{p}" for s, p in ports.items()}
    if facade_port > 0:
        wanted["the gateway's OpenAI HTTP facade"] = f"{host}:{facade_port}"
    if metrics and not ephemeral:
        wanted |= {f"the {s}'s metrics": f"{host}:{p}" for s, p in DEFAULT_METRICS_PORTS.items()}
    try:  # before any service starts: a taken port is one line (exit 2), not a half-started mesh
        for what, address in wanted.items():
            refuse_a_taken_port(address, what, "stop what holds it, or pass --ephemeral")
    except ConfigError as exc:
        fail(str(exc))
    gateway_args = ["--replicas", str(replicas), "--http-port", str(facade_port)]
    for flag, value in (("--backend", backend), ("--model", model), ("--base-url", base_url)):
        if value:
            gateway_args += [flag, value]
    cfg = UpConfig(
        host=host,
        ports=ports,
        gateway_args=tuple(gateway_args),
        scheduler_args=("--output-dir", output_dir),
        # The verifier starts before the gateway: it points verifiers judges at the facade by this
        # port (verifier/config.py facade_url), which a flag or --ephemeral (0: not known yet, judges
        # not pointed) decides, not the variable it would otherwise read.
        env={"ROLLMESH_OPENAI_HTTP_PORT": str(facade_port)},
        grace_s=grace,
        restart=policy,
        metrics_ports=(
            {s: 0 if ephemeral else p for s, p in DEFAULT_METRICS_PORTS.items()} if metrics else None
        ),
    )

    # Children's lines reach stderr through a queue and a thread: a slow terminal or a full pipe
    # drops (and counts) lines, it never stalls the loop that reads the children and handles signals.
    out_lines = LineWriter(
        sys.stderr, drop_notice=lambda n: f"[up] {n} log lines dropped: stderr was not keeping up"
    )
    write = out_lines.write

    async def go() -> int:
        mesh = Mesh(cfg, write)
        stop, force = asyncio.Event(), asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            (force if stop.is_set() else stop).set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        try:
            starter, _ = await first_of(mesh.start(), stop.wait())
            if starter.cancelled():
                return 0
            if exc := starter.exception():
                write(f"[up] failed to start: {exc}")
                return 1
            scrape = mesh.metrics_addresses
            if as_json:
                print_json({**mesh.addresses, "metrics": scrape} if metrics else mesh.addresses)
            elif metrics:
                rows = [(s, a, f"http://{scrape[s]}/metrics") for s, a in mesh.addresses.items()]
                print_table("rollmesh is up (Ctrl-C stops)", ["service", "address", "metrics"], rows)
            else:
                print_table(
                    "rollmesh is up (Ctrl-C stops)", ["service", "address"], list(mesh.addresses.items())
                )
            code = await mesh.supervise(stop)
            if code:
                write("[up] a service could not be kept up; stopping the mesh (exit 1)")
            return code
        finally:
            write("[up] stopping")
            await mesh.stop(cfg.grace_s, force)
            write("[up] stopped")

    try:
        code = run(go())
    finally:
        out_lines.close(timeout_s=5.0)
    raise typer.Exit(code)


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
        print_json([s.to_json() for s in statuses])
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
