"""`rollmesh serve registry|verifier|gateway|scheduler`: one service in the foreground, its flags
overriding its ROLLMESH_* variables (each service's `__main__.main` does the wiring).
`rollmesh serve openenv`: one environment as an OpenEnv server (rollmesh/openenv_server)."""

from __future__ import annotations

from typing import Annotated
from typing import Any

import typer

from rollmesh.commands._common import ApiKey
from rollmesh.commands._common import BaseUrl
from rollmesh.commands._common import Host
from rollmesh.commands._common import MetricsPort
from rollmesh.commands._common import OutputDir
from rollmesh.commands._common import Port
from rollmesh.commands._common import VerifierAddr
from rollmesh.commands._common import err
from rollmesh.commands._common import fail
from rollmesh.commands._common import run
from rollmesh.openenv_server import DEFAULT_MAX_STEPS
from rollmesh.openenv_server import DEFAULT_PORT
from rollmesh.scheduler import DEFAULT_OUTPUT_DIR

serve_app = typer.Typer(
    help="Run one service in the foreground (Ctrl-C or SIGTERM drains and stops).", no_args_is_help=True
)


def serve_service(
    service: str, port: int | None, host: str | None, metrics_port: int | None, **options: Any
) -> None:
    """`rollmesh serve <service>`: `rollmesh.<service>.__main__.main(ServerFlags(...), **options)`
    (imported here, so `--help` stays instant); a configuration or start-up error is one line and
    exit 2."""
    import importlib

    from rollmesh.mesh.config import ServerFlags
    from rollmesh.mesh.errors import ConfigError
    from rollmesh.mesh.errors import RollmeshError

    flags = ServerFlags(port=port, host=host, metrics_port=metrics_port)
    try:
        importlib.import_module(f"rollmesh.{service}.__main__").main(flags, **options)
    except ConfigError as exc:
        fail(str(exc))
    except RollmeshError as exc:
        fail(f"{exc.code.name}: {exc.message} [{exc.reason}]")


@serve_app.command("registry")
def serve_registry(port: Port = None, host: Host = None, metrics_port: MetricsPort = None) -> None:
    """Run the ArtifactRegistry service."""
    serve_service("registry", port, host, metrics_port)


@serve_app.command("verifier")
def serve_verifier(port: Port = None, host: Host = None, metrics_port: MetricsPort = None) -> None:
    """Run the EnvironmentVerifier service."""
    serve_service("verifier", port, host, metrics_port)


@serve_app.command("gateway")
def serve_gateway(
    port: Port = None,
    host: Host = None,
    metrics_port: MetricsPort = None,
    http_port: Annotated[
        int | None,
        typer.Option(
            "--http-port",
            help="OpenAI HTTP facade port (default ROLLMESH_OPENAI_HTTP_PORT or 8000; -1: off).",
        ),
    ] = None,
    replicas: Annotated[
        int | None, typer.Option("--replicas", min=1, help="Data-parallel replicas (ray-serve, fake).")
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option("--backend", help="ray-serve (default), openai or fake (env ROLLMESH_GATEWAY_BACKEND)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Model path or registry name (default tiny-arith); for openai the remote model name.",
        ),
    ] = None,
    base_url: BaseUrl = "",
) -> None:
    """Run the ModelGateway (gRPC) with its OpenAI-compatible HTTP facade."""
    serve_service(
        "gateway",
        port,
        host,
        metrics_port,
        http_port=http_port,
        backend=backend,
        model=model,
        replicas=replicas,
        base_url=base_url,
    )


@serve_app.command("scheduler")
def serve_scheduler(
    port: Port = None,
    host: Host = None,
    metrics_port: MetricsPort = None,
    output_dir: OutputDir = DEFAULT_OUTPUT_DIR,
) -> None:
    """Run the RolloutScheduler service (gateway and verifier from ROLLMESH_*_ADDR)."""
    serve_service("scheduler", port, host, metrics_port, output_dir=output_dir)


@serve_app.command("openenv")
def serve_openenv(
    environment: Annotated[
        str,
        typer.Option("--environment", "-e", help="The rollmesh environment to serve.", show_default=False),
    ],
    dataset: Annotated[
        str,
        typer.Option(
            "--dataset",
            help="Rows a reset plays (a path or a dataset artifact; default: the environment's example"
            " dataset).",
        ),
    ] = "",
    port: Annotated[int, typer.Option("--port", help="Port to bind (0: a free one).")] = DEFAULT_PORT,
    host: Annotated[
        str, typer.Option("--host", help="Host to bind (0.0.0.0: all interfaces).")
    ] = "127.0.0.1",
    max_steps: Annotated[
        int, typer.Option("--max-steps", min=1, help="Turns after which an episode ends and is verified.")
    ] = DEFAULT_MAX_STEPS,
    max_sessions: Annotated[
        int,
        typer.Option(
            "--max-sessions", min=0, help="Episodes (WebSocket sessions) open at once at most (0: no cap)."
        ),
    ] = 0,
    verifier: VerifierAddr = "",
    api_key: ApiKey = "",
) -> None:
    """Serve one environment to OpenEnv clients: HTTP /reset /step /state /schema /health and the
    WebSocket session /ws (one episode per connection; docs/openenv.md).

    Without --verifier (or ROLLMESH_VERIFIER_ADDR) a verifier starts in this process, serving the
    environments of the artifact roots as `rollmesh run` does. With an API key (--api-key,
    ROLLMESH_API_KEY) every route but /health needs `Authorization: Bearer <key>`."""
    from rollmesh.openenv_server.server import serve_openenv as serve

    run(
        serve(
            environment=environment,
            dataset=dataset,
            verifier=verifier,
            api_key=api_key,
            host=host,
            port=port,
            max_steps=max_steps,
            max_sessions=max_sessions,
            say=lambda line: err.print(line, highlight=False),
        )
    )


def register(app: typer.Typer) -> None:
    app.add_typer(serve_app, name="serve")
