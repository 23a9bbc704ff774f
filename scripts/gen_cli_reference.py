#!/usr/bin/env python3
"""Write docs/cli.md, the CLI reference, from the `rollmesh` commands themselves (their usage,
help text, arguments and options), so the page cannot drift from the code.

Usage::

    python scripts/gen_cli_reference.py           # rewrite docs/cli.md
    python scripts/gen_cli_reference.py --check   # exit 1 if docs/cli.md is not what the code says
"""

from __future__ import annotations

import argparse
import enum
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "cli.md"

HEADER = """# CLI reference

Every `rollmesh` command, its arguments and options, as `--help` gives them. This page is generated
from the commands themselves by `scripts/gen_cli_reference.py`; `make docs` (part of `make test`)
fails when it is out of date. Environment variables that configure the services are on the
[configuration](configuration.md) page.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return "on" if param.default else "off"
    default = param.default
    if default is None or default == "" or default == () or callable(default):
        return ""
    if isinstance(default, list | tuple):
        return ", ".join(f"`{d}`" for d in default)
    return f"`{getattr(default, 'value', default)}`"


def _type(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    annotation = param.type_descriptor.annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if getattr(annotation, "__origin__", None) is not None:  # list[str]
        return str(annotation).replace("typing.", "").replace("|", "or")
    return str(getattr(annotation, "__name__", annotation)).replace("|", "or")


def _walk(command: Any, path: list[str], parent: Any) -> Iterator[tuple[list[str], Any, Any]]:
    from typer._click import Context  # typer vendors click

    ctx = Context(command, info_name=path[-1], parent=parent)
    yield path, command, ctx
    for name in sorted(getattr(command, "commands", {})):
        sub = command.commands[name]
        if not sub.hidden:
            yield from _walk(sub, [*path, name], ctx)


def _section(path: list[str], command: Any, ctx: Any) -> list[str]:
    title = " ".join(path)
    lines = [f"## `{title}`", ""]
    lines += [f"`{ctx.command_path} {_usage(command)}`", ""]
    help_text = inspect.cleandoc(command.help or "").split("\f", 1)[0].strip()
    if help_text:
        lines += [help_text, ""]
    if hasattr(command, "commands"):
        subs = [(n, c) for n, c in sorted(command.commands.items()) if not c.hidden]
        lines += ["| command | what |", "|---|---|"]
        for name, sub in subs:
            first = (inspect.cleandoc(sub.help or "").split("\n\n", 1)[0]) if sub.help else ""
            anchor = f"{title} {name}"
            lines.append(f"| [`{name}`](#{_anchor(anchor)}) | {_cell(first)} |")
        lines.append("")
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    options = [p for p in command.params if p.param_type_name == "option" and not p.hidden]
    if arguments:
        lines += ["| argument | type | what |", "|---|---|---|"]
        for p in arguments:
            req = "" if p.required else " (optional)"
            what = _cell(getattr(p, "help", "") or "")
            lines.append(f"| `{(p.metavar or p.name).upper()}`{req} | {_type(p)} | {what} |")
        lines.append("")
    if options:
        lines += ["| option | type | default | what |", "|---|---|---|---|"]
        for p in options:
            names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
            lines.append(f"| {names} | {_type(p)} | {_default(p)} | {_cell(p.help or '')} |")
        lines.append("")
    return lines


def _usage(command: Any) -> str:
    pieces = ["[OPTIONS]"]
    for p in command.params:
        if p.param_type_name == "argument":
            name = (p.metavar or p.name).upper() + ("..." if p.nargs == -1 else "")
            pieces.append(name if p.required else f"[{name}]")
    if hasattr(command, "commands"):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _anchor(title: str) -> str:
    """The id mkdocs' toc gives a heading `` `title` ``: lower case, words joined by '-'."""
    return "-".join(title.lower().replace("_", "-").split())


def render() -> str:

    from rollmesh.cli import build_command

    root = build_command()
    out = [HEADER]
    for path, command, ctx in _walk(root, ["rollmesh"], None):
        out += _section(path, command, ctx)
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="fail if docs/cli.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(
                f"{PAGE.relative_to(REPO)} is out of date: run scripts/gen_cli_reference.py", file=sys.stderr
            )
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
