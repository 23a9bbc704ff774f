"""Log lines that can never stop a process: bounded lines, and a writer that never blocks its caller.

- `truncate_line(text, max_bytes)`: at most `max_bytes` UTF-8 bytes of `text`, then
  `...[truncated N bytes]` naming how many were cut. Text within the cap comes back unchanged.
- `LineAssembler`: turns a byte stream (a child's stdout, read in chunks of any size) into lines of
  at most `max_line_bytes` each, truncated with the same marker. It holds at most `max_line_bytes`
  of a line in memory, however long the line is, so a 1 GB line costs no more than a short one.
- `LineWriter`: `write(line)` puts the line on a bounded queue and returns at once; one daemon
  thread writes the queue to the stream. When the queue is full (the stream is slower than the
  producer, or blocked: a full pipe nobody reads) the line is dropped and counted, and once the
  writer catches up it writes one notice line naming how many were dropped. A slow or stuck stderr
  therefore costs lost log lines, never a stalled event loop. `close(timeout_s)` writes what is
  queued for at most `timeout_s` and returns even if the stream stays blocked.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TextIO

TRUNCATED_MARKER = "...[truncated {n} bytes]"
_BATCH = 256  # lines joined into one write when the writer is behind


def truncate_line(text: str, max_bytes: int) -> str:
    """`text` cut to `max_bytes` UTF-8 bytes plus a marker naming how many bytes were cut."""
    if len(text) <= max_bytes // 4:  # cheap path: cannot exceed max_bytes even at 4 bytes a char
        return text
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text
    head = data[:max_bytes].decode("utf-8", errors="ignore")
    return head + TRUNCATED_MARKER.format(n=len(data) - max_bytes)


class LineAssembler:
    """Feed it chunks of bytes; get back complete lines (without the newline), each capped."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self._head = bytearray()  # the kept start of the current line
        self._cut = 0  # bytes of the current line dropped beyond the cap

    def _add(self, piece: bytes) -> None:
        room = self.max_line_bytes - len(self._head)
        if room > 0:
            self._head += piece[:room]
        self._cut += max(0, len(piece) - max(room, 0))

    def _take(self) -> str:
        text = bytes(self._head).decode("utf-8", errors="replace").rstrip("\r")
        if self._cut:
            text += TRUNCATED_MARKER.format(n=self._cut)
        self._head.clear()
        self._cut = 0
        return text

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            self._add(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        if start < len(chunk):
            self._add(chunk[start:])
        return lines

    def finish(self) -> list[str]:
        """The last line when the stream ended without a newline."""
        return [self._take()] if self._head or self._cut else []


class LineWriter:
    """A bounded queue of lines and one daemon thread writing them to `stream` (see the module doc)."""

    def __init__(
        self,
        stream: TextIO,
        *,
        capacity: int = 10_000,
        drop_notice: Callable[[int], str] = lambda n: f"[log] {n} lines dropped: the stream was too slow",
    ) -> None:
        self.stream = stream
        self._fd: int | None = None
        with contextlib.suppress(Exception):  # no real fd (a test's capture): write through the stream
            self._fd = stream.fileno()
        self.drop_notice = drop_notice
        self.dropped_total = 0
        self._dropped = 0  # since the last notice
        self._lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=capacity)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="rollmesh-log-writer", daemon=True)
        self._thread.start()

    def write(self, line: str) -> None:
        """Queue one line (no trailing newline); never blocks. Dropped and counted when full."""
        if self._closed:
            return
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            with self._lock:
                self._dropped += 1
                self.dropped_total += 1

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            batch = [first]
            while len(batch) < _BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            lines = [line for line in batch if line is not None]
            with self._lock:
                dropped, self._dropped = self._dropped, 0
            if dropped:
                lines.insert(0, self.drop_notice(dropped))
            if lines:
                with contextlib.suppress(Exception):  # a closed or broken stream loses lines, nothing else
                    self._out("\n".join(lines) + "\n")
            for _ in batch:
                self._queue.task_done()
            if done:
                return

    def _out(self, text: str) -> None:
        if self._fd is None:
            self.stream.write(text)
            self.stream.flush()
            return
        # os.write holds no Python-level lock while it blocks, so a stuck pipe never wedges
        # another thread's (or the interpreter's exit-time) use of the stream object.
        data = memoryview(text.encode("utf-8", errors="replace"))
        while data:
            data = data[os.write(self._fd, data) :]

    def flush(self, timeout_s: float = 2.0) -> None:
        """Wait, at most `timeout_s`, until every queued line has been written."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.005)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop taking lines, write the queued ones for at most `timeout_s`, end the thread."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=0.05)
                break
        self._thread.join(max(0.0, deadline - time.monotonic()))
