"""`rollmesh`: the root Typer app. Commands live in rollmesh/commands/<name>.py, each exposing
`register(app)`; this file only gathers them (so `--help` stays instant: heavy imports are lazy).

Ctrl-C while the commands are still being imported (a second or more on a loaded machine) ends the
command with "interrupted" and exit 130, as Ctrl-C does later, not with an import traceback."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import typer
    import typer._click  # typer ships its own click: its commands are these


EXIT_INTERRUPTED = 130


def _version(value: bool) -> None:
    import typer

    from rollmesh import __version__

    if value:
        typer.echo(f"rollmesh {__version__}")
        raise typer.Exit()


def build_app() -> typer.Typer:
    import typer

    from rollmesh import commands

    app = typer.Typer(
        name="rollmesh",
        help="Collect LLM rollouts against verifiable environments over a typed gRPC mesh.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False, "--version", callback=_version, is_eager=True, help="Print the version."
        ),
    ) -> None:
        """rollmesh command line."""
        from rollmesh.mesh.logging import configure

        # Log lines go to stderr, warnings and up unless ROLLMESH_LOG_LEVEL says otherwise (a service
        # started here configures its own). Unconfigured, structlog printed them on stdout, in the
        # middle of the JSON that `aggregate`, `profile` and `--json` print there.
        configure(level=os.environ.get("ROLLMESH_LOG_LEVEL") or "warning")

    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"rollmesh.commands.{mod.name}").register(app)
    return app


def build_command() -> typer._click.Command:
    """The click command `main` runs and docs/cli.md documents, its help tidied (commands/_help.py)."""
    import typer

    from rollmesh.commands._help import tidy

    command = typer.main.get_command(build_app())
    tidy(command)
    return command


def main() -> None:
    # gRPC's C core logs fork/poller INFO lines when Ray or vLLM spawn processes; users can override.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    try:
        build_command()()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None


if __name__ == "__main__":
    main()
