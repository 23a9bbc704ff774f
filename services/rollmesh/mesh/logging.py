"""structlog configured once: JSON when not a TTY, console otherwise; stdlib logs routed through it.

Logging can never stop a service:
- lines go to stderr through a `QueuedHandler`: the caller formats the record and queues the line;
  one thread writes stderr. A slow or blocked stderr drops lines (counted, then reported in one
  `log_lines_dropped` line) instead of blocking the event loop;
- every line is at most ROLLMESH_LOG_MAX_LINE_BYTES (default 16 KiB): long string fields are cut
  to half of that first, each with a `...[truncated N bytes]` marker; a JSON event still too big
  is rendered again smaller (shorter strings, the last 3 exceptions of a chain with their last 3
  frames, `truncated_bytes` saying how much went), so a JSON line stays JSON; the rendered line is
  cut with the marker only as a last resort;
- tracebacks keep at most 20 frames and carry no frame locals unless ROLLMESH_LOG_LOCALS=1.
"""

from __future__ import annotations

import logging
import sys
from typing import Any
from typing import TextIO

import structlog

from rollmesh.mesh import config
from rollmesh.mesh.lines import LineWriter
from rollmesh.mesh.lines import truncate_line

TRACEBACK_MAX_FRAMES = 20

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso"),
]


def cap_strings(value: Any, max_chars: int) -> Any:
    """`value` with every string inside it (dicts, lists, tuples) cut to `max_chars` with a marker."""
    if isinstance(value, str):
        return truncate_line(value, max_chars) if len(value) > max_chars else value
    if isinstance(value, dict):
        return {k: cap_strings(v, max_chars) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [cap_strings(v, max_chars) for v in value]
    return value


def _cap_fields(max_chars: int) -> Any:
    """A structlog processor: long strings in the event dict are cut before rendering."""
    return lambda logger, name, event_dict: cap_strings(event_dict, max_chars)


class _BoundedJSONRenderer:
    """JSONRenderer whose line stays within `max_bytes` and stays JSON (the module docstring says how)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.render = structlog.processors.JSONRenderer()

    def _size(self, line: str | bytes) -> int:
        return len(line if isinstance(line, bytes) else line.encode("utf-8", errors="replace"))

    def __call__(self, logger: Any, name: str, event_dict: Any) -> Any:
        line = self.render(logger, name, event_dict)
        size = self._size(line)
        if size <= self.max_bytes:
            return line
        small = cap_strings(event_dict, max(64, self.max_bytes // 16))
        chain = small.get("exception")
        if isinstance(chain, list):
            small["exception"] = [
                {**e, "frames": e.get("frames", [])[-3:]} if isinstance(e, dict) else e for e in chain[-3:]
            ]
        smaller = self.render(logger, name, small)
        small["truncated_bytes"] = size - self._size(smaller)
        return self.render(logger, name, small)


class QueuedHandler(logging.Handler):
    """Formats in the caller, caps the line, hands it to a `LineWriter`; `emit` never blocks."""

    def __init__(self, writer: LineWriter, max_line_bytes: int) -> None:
        super().__init__()
        self.writer = writer
        self.max_line_bytes = max_line_bytes

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = truncate_line(self.format(record), self.max_line_bytes)
        except Exception:
            self.handleError(record)
            return
        self.writer.write(line)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        super().close()


def _render_drop(formatter: logging.Formatter, dropped: int) -> str:
    """The notice line for `dropped` lost lines, in the same shape as every other line."""
    record = logging.LogRecord(
        "rollmesh.logging",
        logging.WARNING,
        __file__,
        0,
        "log_lines_dropped: %d lines dropped, stderr was not keeping up",
        (dropped,),
        None,
    )
    return formatter.format(record)


def configure(
    level: str | None = None,
    *,
    json: bool | None = None,
    stream: TextIO | None = None,
    others: TextIO | None = None,
) -> None:
    """Configure structlog and the stdlib root logger to write one shape of line to `stream`
    (default: stderr); `others`, when given, takes the lines of loggers outside `rollmesh`
    (Ray's, vLLM's, ...), so a command can show its own lines and file the libraries' elsewhere.

    `level` defaults to ROLLMESH_LOG_LEVEL (info); `json` to ROLLMESH_LOG_JSON (JSON unless a TTY).
    Calls below the level are dropped before any processor runs (`filter_by_level`), so a debug
    line on a hot path costs a level check, not a timestamp and a render.
    """
    stream = stream or sys.stderr
    level = level or str(config.read("ROLLMESH_LOG_LEVEL"))
    if json is None:
        json = config.read("ROLLMESH_LOG_JSON")
    max_line = max(256, int(config.read("ROLLMESH_LOG_MAX_LINE_BYTES")))
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
    handlers = [_handler(stream, json, max_line)]
    if others is not None:
        own = logging.Filter("rollmesh")
        handlers[0].addFilter(own)
        handlers.append(_handler(others, json, max_line))
        handlers[1].addFilter(lambda record: not own.filter(record))
    root = logging.getLogger()
    for old in root.handlers:
        if isinstance(old, QueuedHandler):
            old.close()
    root.handlers[:] = handlers
    root.setLevel(level.upper())
    for noisy in ("grpc", "ray", "vllm", "httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def _handler(stream: TextIO, json: bool | None, max_line: int) -> QueuedHandler:
    """A handler writing `stream` in its shape: JSON unless `stream` is a TTY (or as `json` says)."""
    show_locals = bool(config.read("ROLLMESH_LOG_LOCALS"))
    final: list[Any]
    if (not stream.isatty()) if json is None else json:
        tracebacks = structlog.tracebacks.ExceptionDictTransformer(
            show_locals=show_locals, max_frames=TRACEBACK_MAX_FRAMES
        )
        final = [
            structlog.processors.ExceptionRenderer(tracebacks),
            _cap_fields(max_line // 2),
            _BoundedJSONRenderer(max_line),
        ]
    else:
        exc_formatter = structlog.dev.RichTracebackFormatter(
            show_locals=show_locals, max_frames=TRACEBACK_MAX_FRAMES
        )
        final = [
            _cap_fields(max_line // 2),
            structlog.dev.ConsoleRenderer(colors=stream.isatty(), exception_formatter=exc_formatter),
        ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_SHARED,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
    )
    handler = QueuedHandler(LineWriter(stream, drop_notice=lambda n: _render_drop(formatter, n)), max_line)
    handler.setFormatter(formatter)
    return handler


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name)  # type: ignore[no-any-return]
