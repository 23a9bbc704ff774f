"""Log lines that cannot stop a process: capped lines, a line reader for any length, a writer that
drops (and counts) instead of blocking, and a service whose stderr nobody reads keeps its loop."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
import structlog

from rollmesh.mesh.lines import LineAssembler
from rollmesh.mesh.lines import LineWriter
from rollmesh.mesh.lines import truncate_line
from rollmesh.mesh.logging import configure
from rollmesh.mesh.logging import get_logger


def test_truncate_line_keeps_short_text_and_names_what_it_cut() -> None:
    assert truncate_line("hello", 10) == "hello"
    assert truncate_line("x" * 100, 10) == "x" * 10 + "...[truncated 90 bytes]"
    cut = truncate_line("é" * 10, 5)  # 20 bytes; a split character is dropped, not mangled
    assert cut == "éé...[truncated 15 bytes]"


def test_assembler_takes_a_one_megabyte_line_in_small_chunks() -> None:
    data = b"start\n" + b"x" * 1_000_000 + b"\nafter\npartial"
    asm = LineAssembler(max_line_bytes=1000)
    lines: list[str] = []
    for i in range(0, len(data), 4096):
        lines += asm.feed(data[i : i + 4096])
    lines += asm.finish()
    assert lines == ["start", "x" * 1000 + "...[truncated 999000 bytes]", "after", "partial"]


def test_writer_never_blocks_on_a_pipe_nobody_reads() -> None:
    read_fd, write_fd = os.pipe()
    stream = os.fdopen(write_fd, "w")
    writer = LineWriter(stream, capacity=100, drop_notice=lambda n: f"DROPPED {n}")
    started = time.monotonic()
    for i in range(50_000):  # ~1 MB: far beyond the pipe's 64 KiB buffer
        writer.write(f"line {i} " + "y" * 10)
    assert time.monotonic() - started < 5.0  # would hang forever if write() blocked
    assert writer.dropped_total > 0

    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_fd, 65536), b"")))
    reader.start()  # now the stream drains; the writer catches up and reports the loss
    writer.flush(timeout_s=10)
    writer.write("last line")  # room again: nothing is dropped once the stream keeps up
    writer.close(timeout_s=10)
    stream.close()
    reader.join(10)
    text = b"".join(chunks).decode()
    reported = [int(line.split()[1]) for line in text.splitlines() if line.startswith("DROPPED")]
    assert sum(reported) == writer.dropped_total
    assert text.rstrip().endswith("last line")
    assert len(text.splitlines()) < 50_000


def test_writer_without_a_file_descriptor_writes_through_the_stream() -> None:
    buf = io.StringIO()
    writer = LineWriter(buf)
    writer.write("one")
    writer.write("two")
    writer.close()
    assert buf.getvalue() == "one\ntwo\n"


CHILD = textwrap.dedent(
    """
    import asyncio, logging, sys, time
    from rollmesh.mesh.logging import configure, get_logger

    configure(json=True)
    log = get_logger("flood")

    async def main():
        lag = 0.0
        stop = False
        async def ticker():
            nonlocal lag
            while not stop:
                t = time.monotonic()
                await asyncio.sleep(0.01)
                lag = max(lag, time.monotonic() - t - 0.01)
        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        started = time.monotonic()
        log.info("big", payload="x" * 1_000_000)
        try:
            raise RuntimeError("e" * 200_000)
        except RuntimeError:
            secret = "hunter2"  # a frame local: must not reach the log
            log.exception("failed", where=secret[:1])
        for i in range(20_000):
            log.info("flood", i=i)
            if i % 500 == 0:
                await asyncio.sleep(0)
        took = time.monotonic() - started
        stop = True
        await tick
        print(f"flooded took={took:.3f} lag={lag:.3f}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        # stderr is read now: once the queue has drained there is room again
        await asyncio.to_thread(logging.getLogger().handlers[0].writer.flush, 30)
        log.info("after")

    asyncio.run(main())
    """
)


async def test_a_service_logging_a_megabyte_line_and_a_flood_keeps_its_loop() -> None:
    """stderr is a pipe nobody reads while the child logs: its event loop must keep ticking."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    try:
        report = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert report.startswith("flooded"), report
        fields = dict(kv.split("=") for kv in report.split()[1:])
        assert float(fields["lag"]) < 2.0, report  # blocked on a full pipe, this would never print
        drained = asyncio.create_task(proc.stderr.read())
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        err = (await drained).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = err.splitlines()
    assert max(len(line.encode()) for line in lines) <= 16384 + 64
    assert "log_lines_dropped" in err  # the flood overflowed the queue; the loss is reported
    assert '"event": "after"' in lines[-1]
    big = json.loads(next(line for line in lines if '"event": "big"' in line))  # still JSON
    assert big["payload"].endswith("...[truncated 991808 bytes]")
    failed = json.loads(next(line for line in lines if '"event": "failed"' in line))
    assert failed["exception"][0]["exc_type"] == "RuntimeError"
    assert "hunter2" not in err  # no frame locals by default


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        for h in root.handlers:
            h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()


@pytest.mark.usefixtures("restore_logging")
def test_a_long_exception_chain_is_one_bounded_json_line(capfd: pytest.CaptureFixture[str]) -> None:
    configure(json=True)
    log = get_logger("chain")

    def fail(depth: int) -> None:
        if depth == 0:
            raise ValueError("v" * 15000)
        try:
            fail(depth - 1)
        except ValueError as exc:
            raise RuntimeError("r" * 15000) from exc

    try:
        fail(6)
    except RuntimeError:
        log.exception("chained")
    logging.getLogger().handlers[0].flush()
    line = next(line for line in capfd.readouterr().err.splitlines() if '"chained"' in line)
    event = json.loads(line)  # still JSON
    assert len(line.encode()) <= 16384
    assert event["truncated_bytes"] > 0 and len(event["exception"]) <= 3
    assert all(len(e["frames"]) <= 3 for e in event["exception"])
