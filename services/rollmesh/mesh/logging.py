"""structlog configured once: JSON when not a TTY, console otherwise; stdlib logs routed through it."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from rollmesh.mesh import config

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso"),
]


def configure(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger to write one shape of line to stderr.

    `level` defaults to ROLLMESH_LOG_LEVEL (info); `json` to ROLLMESH_LOG_JSON (JSON unless a TTY).
    Calls below the level are dropped before any processor runs (`filter_by_level`), so a debug
    line on a hot path costs a level check, not a timestamp and a render.
    """
    level = level or str(config.read("ROLLMESH_LOG_LEVEL"))
    if json is None:
        json = config.read("ROLLMESH_LOG_JSON")
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any
    if use_json:
        renderer = structlog.processors.JSONRenderer()
        final: list[Any] = [structlog.processors.dict_tracebacks, renderer]
    else:
        final = [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("grpc", "ray", "vllm", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name)  # type: ignore[no-any-return]
