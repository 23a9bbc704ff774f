"""`rollmesh config`: every ROLLMESH_* variable with its default and meaning (from mesh/config.py)."""

from __future__ import annotations

import os

import typer

from rollmesh.commands._common import JsonOut, print_json, print_table


def show_config(as_json: JsonOut = False) -> None:
    """List every ROLLMESH_* environment variable: default, value in this shell, and what it does."""
    from rollmesh.mesh.config import ENV_VARS

    rows = [
        {
            "name": v.name,
            "default": "" if v.default is None else str(v.default),
            "set": os.environ.get(v.name, ""),
            "doc": v.doc,
        }
        for v in sorted(ENV_VARS.values(), key=lambda v: v.name)
    ]
    if as_json:
        print_json(rows)
    else:
        print_table(
            "ROLLMESH_* variables",
            ["name", "default", "set here", "meaning"],
            [tuple(r.values()) for r in rows],
        )


def register(app: typer.Typer) -> None:
    app.command("config")(show_config)
