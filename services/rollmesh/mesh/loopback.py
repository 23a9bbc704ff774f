"""Loopback ports this process serves itself, by port: the protocol factory of the server that
listens there, for the event loop it runs on.

A confined agent program reaches its capture's and tools' ports through listening sockets made in
its network namespace and handed to the scheduler (scheduler/drivers/program.py
`loopback_relays`). When this process is the one serving such a port (the tool endpoint always;
the gateway's OpenAI facade in an embedded mesh), the handed socket is served by the same server
directly, instead of relaying each connection to the port over a second TCP connection: the same
routes and tokens answer, with one hop and its copies less. A port served in another process, or
on another event loop, is relayed as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

ProtocolFactory = Callable[[], asyncio.BaseProtocol]

_served: dict[int, tuple[asyncio.AbstractEventLoop, ProtocolFactory]] = {}


def serve_here(port: int, factory: ProtocolFactory) -> None:
    """Register `factory` (what the server on 127.0.0.1:`port` makes per connection) for the
    running event loop; `forget` it when that server stops."""
    _served[port] = (asyncio.get_running_loop(), factory)


def forget(port: int, factory: ProtocolFactory | None = None) -> None:
    """Unregister `port` (only when it is still `factory`'s, when given)."""
    entry = _served.get(port)
    if entry is not None and (factory is None or entry[1] is factory):
        del _served[port]


def served_here(port: int) -> ProtocolFactory | None:
    """The factory of the server this process runs on `port` on the running loop; None when none."""
    entry = _served.get(port)
    if entry is None or entry[0] is not asyncio.get_running_loop():
        return None
    return entry[1]
