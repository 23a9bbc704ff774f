"""Every `ROLLMESH_*` environment variable, with its default, parser and doc, in one table.

Read once into frozen dataclasses and passed down; nothing else reads `os.environ` for these.
Precedence everywhere: CLI flag > environment variable > default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A configuration value is malformed; the message names the variable and what is allowed."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(name: str, raw: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off (any case); anything else is a ConfigError naming `name`."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


def parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def parse_float(name: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None


def parse_address(name: str, raw: str) -> str:
    """host:port (no scheme). A URL here is the usual mistake, so say so."""
    value = raw.strip()
    if "://" in value:
        raise ConfigError(f"{name}={raw!r} looks like a URL; give host:port, e.g. 127.0.0.1:50051")
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{name}={raw!r} is not host:port (port 0-65535)")
    return value


def parse_str(name: str, raw: str) -> str:
    del name
    return raw


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: Any
    parse: Callable[[str, str], Any]
    doc: str


DEFAULT_PORTS = {"registry": 50051, "verifier": 50052, "gateway": 50053, "scheduler": 50054}
OPENAI_HTTP_PORT = 8000
SERVICES = tuple(DEFAULT_PORTS)

ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in [
        EnvVar("ROLLMESH_ROOT", "", parse_str, "The last artifact root (default: the built-in root)."),
        EnvVar(
            "ROLLMESH_EXTRA_ROOTS",
            "",
            parse_str,
            "Artifact roots searched after the working directory, os.pathsep-separated, in order.",
        ),
        EnvVar(
            "ROLLMESH_ALLOW_ROOT_OVERRIDE",
            False,
            parse_bool,
            "A name in two roots resolves to the earliest root instead of an ARTIFACT_COLLISION error.",
        ),
        EnvVar(
            "ROLLMESH_API_KEY", "", parse_str, "Bearer token servers require (health and reflection exempt)."
        ),
        EnvVar("ROLLMESH_LOG_LEVEL", "info", parse_str, "debug, info, warning or error."),
        EnvVar(
            "ROLLMESH_LOG_JSON", None, parse_bool, "Force JSON logs on or off (default: JSON unless a TTY)."
        ),
        EnvVar("ROLLMESH_BIND_HOST", "127.0.0.1", parse_str, "Host servers bind; 0.0.0.0 only when asked."),
        EnvVar("ROLLMESH_GRACE_SECONDS", 10.0, parse_float, "Seconds to drain RPCs on SIGTERM."),
        *(
            EnvVar(
                f"ROLLMESH_{svc.upper()}_ADDR",
                f"127.0.0.1:{port}",
                parse_address,
                f"Address of the {svc} service (host:port).",
            )
            for svc, port in DEFAULT_PORTS.items()
        ),
    ]
}


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of a registered variable, or its default when unset or empty."""
    var = ENV_VARS[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw == "":
        return var.default
    return var.parse(name, raw)


def service_addr(service: str, environ: Mapping[str, str] | None = None) -> str:
    """`ROLLMESH_<SERVICE>_ADDR`, or the default loopback port from DESIGN.md."""
    return str(read(f"ROLLMESH_{service.upper()}_ADDR", environ))


@dataclass(frozen=True)
class ServerConfig:
    """What every server needs, read once."""

    host: str = "127.0.0.1"
    port: int = 0
    api_key: str = ""
    grace_seconds: float = 10.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def from_env(
        cls,
        service: str,
        *,
        port: int | None = None,
        host: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ServerConfig:
        addr_port = int(service_addr(service, environ).rpartition(":")[2])
        return cls(
            host=host or str(read("ROLLMESH_BIND_HOST", environ)),
            port=addr_port if port is None else port,
            api_key=str(read("ROLLMESH_API_KEY", environ)),
            grace_seconds=float(read("ROLLMESH_GRACE_SECONDS", environ)),
        )
