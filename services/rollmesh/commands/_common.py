"""What every CLI command shares: address options and `connect()`, error mapping, output (data to stdout,
messages to stderr), and running one coroutine per command."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Any
from typing import NoReturn
from typing import TypeVar

import typer
from rich.console import Console
from rich.table import Table

from rollmesh.commands._exit import EXIT_ERROR
from rollmesh.commands._exit import EXIT_INTERRUPTED
from rollmesh.commands._exit import EXIT_USAGE

if TYPE_CHECKING:
    from rollmesh_client import Client

T = TypeVar("T")

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _addr_option(service: str) -> Any:
    """`--<service> host:port`; empty: ROLLMESH_<SERVICE>_ADDR, else the default port from the config
    table (mesh/config.py, not imported here so `--help` stays fast; `rollmesh config` lists it)."""
    return typer.Option(
        f"--{service}",
        envvar=f"ROLLMESH_{service.upper()}_ADDR",
        help=f"{service.capitalize()} host:port (default: the config table's, see `rollmesh config`).",
        show_default=False,
    )


# An address option's value is "" unless given: `connect()` then takes the configured default.
RegistryAddr = Annotated[str, _addr_option("registry")]
VerifierAddr = Annotated[str, _addr_option("verifier")]
GatewayAddr = Annotated[str, _addr_option("gateway")]
SchedulerAddr = Annotated[str, _addr_option("scheduler")]
ApiKey = Annotated[
    str,
    typer.Option(
        "--api-key", envvar="ROLLMESH_API_KEY", help="Bearer token for the services.", show_default=False
    ),
]
Port = Annotated[
    int | None, typer.Option("--port", help="Port to bind (default: ROLLMESH_<SERVICE>_ADDR's port).")
]
Host = Annotated[
    str | None,
    typer.Option("--host", help="Host to bind (default 127.0.0.1; 0.0.0.0 to listen on all interfaces)."),
]
MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: a free port; -1: off; default:"
        " ROLLMESH_METRICS_PORT, else off).",
        show_default=False,
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]
BaseUrl = Annotated[str, typer.Option("--base-url", help="OpenAI-compatible model URL (the openai backend).")]
# The scheduler's results root (`serve scheduler`, and `up`, which passes it on); its default is
# rollmesh.scheduler.DEFAULT_OUTPUT_DIR.
OutputDir = Annotated[
    str, typer.Option("--output-dir", help="Where the scheduler's JSONL sinks write <job_id>/.")
]

_USER_CODES = {"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION", "ALREADY_EXISTS", "UNAUTHENTICATED"}


def fail(message: str, *, code: int = EXIT_USAGE) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


async def connect(*, api_key: str = "", timeout_s: float | None = 60.0, **addresses: str) -> Client:
    """The CLI's one way to reach the mesh: `async with await connect(scheduler=addr) as c`.
    An empty address is ROLLMESH_<SERVICE>_ADDR or the default port (mesh/config.py); an empty
    api_key is ROLLMESH_API_KEY."""
    from rollmesh_client import Client

    return await Client.connect(**addresses, api_key=api_key or None, timeout_s=timeout_s)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one coroutine; known errors become one line on stderr and an exit code, never a traceback."""
    from rollmesh.mesh.errors import ConfigError
    from rollmesh.mesh.errors import RollmeshError
    from rollmesh_client import RollmeshClientError

    try:
        return asyncio.run(coro)
    except RollmeshClientError as exc:
        unavailable = exc.code.name == "UNAVAILABLE"
        hint = " (is the service running? `rollmesh status` shows the mesh)" if unavailable else ""
        fail(f"{exc}{hint}", code=EXIT_USAGE if exc.code.name in _USER_CODES else EXIT_ERROR)
    except RollmeshError as exc:
        fail(
            f"{exc.code.name}: {exc.message} [{exc.reason}]",
            code=EXIT_USAGE if exc.code.name in _USER_CODES else EXIT_ERROR,
        )
    except (ConfigError, ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        err.print("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def as_dict(message: Any, *, unset_too: bool = False) -> dict[str, Any]:
    """A proto message as JSON data under its .proto field names (`unset_too`: scalars left at
    their default are listed too). 64-bit integers are JSON numbers: proto3's JSON mapping writes
    them as strings (`"num_failures": "5"`), which made `jq '.num_failures > 0'` compare a string."""
    from google.protobuf import json_format

    data: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=unset_too
    )
    return _int64_as_numbers(message.DESCRIPTOR, data)


def _int64_as_numbers(descriptor: Any, data: dict[str, Any]) -> dict[str, Any]:
    """`data` (MessageToDict's shape of a `descriptor` message) with every 64-bit integer field,
    in nested messages, lists and map values too, back to an int."""
    from google.protobuf.descriptor import FieldDescriptor as F

    wide = {F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64}

    def value(field: Any, v: Any) -> Any:
        if field.type in wide:
            return int(v)
        if field.type == F.TYPE_MESSAGE and isinstance(v, dict):
            if field.message_type.full_name.startswith("google.protobuf."):
                return v  # well-known types have a JSON form of their own (Struct, Timestamp, ...)
            return _int64_as_numbers(field.message_type, v)
        return v

    for field in descriptor.fields:
        if field.name not in data:
            continue
        v = data[field.name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry_value = field.message_type.fields_by_name["value"]
            data[field.name] = {k: value(entry_value, x) for k, x in v.items()}
        elif isinstance(v, list):
            data[field.name] = [value(field, x) for x in v]
        else:
            data[field.name] = value(field, v)
    return data


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()  # a long-running command (`rollmesh up --json`) is read while it runs


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, show_lines=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*(str(v) for v in r))
    out.print(table)
