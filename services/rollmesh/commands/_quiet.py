"""`rollmesh run`'s terminal while an embedded mesh runs: rollmesh's own lines only.

Ray, Ray Serve, vLLM, the raylet and every library they load print to this process's stdout and
stderr (and their child processes inherit both). While `services_output` is active, file
descriptors 1 and 2 point at a log file, so all of that lands there, whoever writes it (Python,
C++, a child process); rollmesh's own lines (the CLI's console and the `rollmesh.*` loggers) go to
the terminal through copies of the original descriptors. The log starts as
`<output_dir>/rollmesh-run-<time>-<pid>.log` (the job folder does not exist before the job is
submitted), moves into the job folder as `services.log` once it does (`services.2.log`, ... when
a resumed job's folder already has one; the file stays open while it moves), and is named at the
end, also when the command fails.

After the command, at interpreter exit, descriptors 1 and 2 point at the log again, once the
result is flushed: what libraries print while the interpreter shuts down (triton's nanobind
reports its "leaked N instances" there) goes to the log too, not under the result.

`verbose=True` changes nothing: everything prints where it always did.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from rollmesh.commands._common import err
from rollmesh.scheduler.store import SERVICES_LOG


class ServicesLog:
    """Where the services' output goes (`path` follows the file when it moves)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def into_job_folder(self, folder: str) -> None:
        """Move the log into the job's folder (the first free `services[.N].log`); the open file
        keeps its descriptor, so nothing written before or during the move is lost."""
        if not folder or not Path(folder).is_dir():
            return  # a gRPC sink keeps no folder: the log stays where it is
        stem, suffix = os.path.splitext(SERVICES_LOG)
        for n in range(1, 1000):
            target = Path(folder) / (SERVICES_LOG if n == 1 else f"{stem}.{n}{suffix}")
            if not target.exists():
                os.replace(self.path, target)
                self.path = target
                return


def _terminal(fd: int, like: TextIO) -> TextIO:
    """A text stream over a copy of `like`'s descriptor (its encoding), line-buffered; kept open
    for the process's life (a log thread may still write it)."""
    return open(os.dup(fd), "w", encoding=like.encoding or "utf-8", errors="backslashreplace", buffering=1)


def _log_at_exit(log_fd: int) -> None:
    """At interpreter exit, after the result is flushed: descriptors 1 and 2 to the log."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)


def _holds_output(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


@contextlib.contextmanager
def services_output(output_dir: Path, *, verbose: bool) -> Iterator[ServicesLog | None]:
    """Capture the services' output in a log file while the block runs (the module's contract);
    yields that log (None with `verbose`: nothing is captured)."""
    from rollmesh.mesh.logging import configure

    if verbose:
        configure(level="warning")
        yield None
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    log = ServicesLog(output_dir / f"rollmesh-run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
    log_fd = os.open(log.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    term_out, term_err = _terminal(1, sys.stdout), _terminal(2, sys.stderr)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    err.file = term_err
    configure(level="warning", stream=term_err, others=sys.stderr)
    atexit.register(_log_at_exit, log_fd)
    failed = True
    try:
        yield log
        failed = False
    finally:
        for stream in (sys.stdout, sys.stderr, term_err):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(term_out.fileno(), 1)
        os.dup2(term_err.fileno(), 2)
        err.file = None  # type: ignore[assignment]  # (rich: back to sys.stderr)
        configure(level="warning")
        if failed and _holds_output(log.path):
            err.print(f"Ray, Serve and vLLM output: {log.path}", highlight=False, markup=False)
        elif failed:  # nothing was written (the fake or openai backend, an early failure): no empty file
            with contextlib.suppress(OSError):
                log.path.unlink()
