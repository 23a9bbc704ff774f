"""mesh/_confine.py's expose relay (a confined agent server's port, reached over a Unix socket): a
connection to a port whose listen backlog is full never holds up the relay's other connections.
http.server listens with a backlog of 5, and rollmesh opens a connection per rollout in flight: the
relay's connect used to wait for the kernel's retries of the dropped SYN (seconds to minutes, the
whole relay with it)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

RELAY = textwrap.dedent(
    """
    import socket, sys
    from rollmesh.mesh._confine import _relay
    listeners = []
    for path, port in zip(sys.argv[1::2], sys.argv[2::2]):
        s = socket.socket(socket.AF_UNIX)
        s.bind(path + ".tmp")
        s.listen(16)
        listeners.append((s, int(port)))
    import os
    for path in sys.argv[1::2]:
        os.rename(path + ".tmp", path)  # (there only once listening)
    _relay(listeners)
    """
)


def _answer_once(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn:
        conn.recv(1024)
        conn.sendall(b"pong")


def _until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


@pytest.mark.timeout(120)
def test_a_connection_the_servers_full_backlog_dropped_holds_up_no_other(tmp_path: Path) -> None:
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)  # room for one connection, never accepted: the next SYNs are dropped
    filler = socket.create_connection(full.getsockname())
    live = socket.socket()
    live.bind(("127.0.0.1", 0))
    live.listen(8)
    answering = threading.Thread(target=_answer_once, args=(live,), daemon=True)
    answering.start()
    to_full, to_live = tmp_path / "full.sock", tmp_path / "live.sock"
    args = [str(to_full), str(full.getsockname()[1]), str(to_live), str(live.getsockname()[1])]
    relay = subprocess.Popen([sys.executable, "-c", RELAY, *args])
    stuck = socket.socket(socket.AF_UNIX)
    client = socket.socket(socket.AF_UNIX)
    try:
        _until(lambda: to_full.exists() and to_live.exists(), 60)
        stuck.connect(str(to_full))
        stuck.sendall(b"ping")  # its relayed connection waits in the kernel's SYN retries
        client.settimeout(60)  # (the dropped SYN's retries outlast it: 1 + 2 + 4 + ... s)
        client.connect(str(to_live))
        client.sendall(b"ping")
        assert client.recv(16) == b"pong"
        assert relay.poll() is None
    finally:
        for s in (stuck, client, filler, full, live):
            s.close()
        relay.kill()
        relay.wait()
