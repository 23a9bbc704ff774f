"""mesh/loopback.py: the ports this process serves itself, for the loop it serves them on; the tool
endpoint and the gateway's facade register theirs while they run, and a program's socket handed
over for such a port is served by that server (scheduler/drivers/program.py `_take_listeners`)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rollmesh.gateway import Gateway
from rollmesh.gateway.backends.fake import FakeBackend
from rollmesh.gateway.http import HttpFacade
from rollmesh.mesh import loopback
from rollmesh.scheduler.drivers import program
from rollmesh.scheduler.drivers.agent_loop import Json
from rollmesh.scheduler.drivers.agent_loop import ToolResult
from rollmesh.scheduler.drivers.tool_endpoint import ToolEndpoint


async def test_a_port_is_served_here_only_on_its_loop_and_until_forgotten() -> None:
    def factory() -> asyncio.Protocol:
        return asyncio.Protocol()

    def other() -> asyncio.Protocol:
        return asyncio.Protocol()

    loopback.serve_here(1, factory)
    try:
        assert loopback.served_here(1) is factory
        assert loopback.served_here(2) is None

        def elsewhere() -> object:
            async def ask() -> object:
                return loopback.served_here(1)

            return asyncio.run(ask())

        assert await asyncio.to_thread(elsewhere) is None  # another thread's loop: not its server
        loopback.forget(1, other)  # only the factory that registered it unregisters it
        assert loopback.served_here(1) is factory
    finally:
        loopback.forget(1, factory)
    assert loopback.served_here(1) is None


async def test_the_tool_endpoint_and_the_facade_register_their_ports_while_they_run() -> None:
    tools = ToolEndpoint()
    url, _ = await tools.open([], _never)
    port = urlsplit(url).port
    assert port is not None and loopback.served_here(port) is not None
    await tools.stop()
    assert loopback.served_here(port) is None

    gateway = Gateway([FakeBackend("tiny")])
    await gateway.start()
    facade = HttpFacade(gateway, port=0)
    try:
        await facade.start()
        assert loopback.served_here(facade.port) is not None
    finally:
        await facade.stop()
        await gateway.shutdown()
    assert loopback.served_here(facade.port) is None


async def test_a_handed_over_socket_is_served_by_the_tool_endpoint_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a program's confinement does (mesh/_confine.py `_isolate`), here without a namespace: a
    socket listening on a port of its own is handed over for the tools' port; a call made to it is
    answered by the endpoint itself (the rollout's route), never relayed to the tools' port."""
    relayed: list[int] = []

    async def relay(port: int, reader: object, writer: asyncio.StreamWriter) -> None:
        relayed.append(port)
        writer.close()

    monkeypatch.setattr(program, "_relay", relay)
    calls: list[Json] = []

    async def handler(call: Json) -> ToolResult:
        calls.append(call)
        return ToolResult(output="7")

    tools = ToolEndpoint()
    url, _ = await tools.open([{"name": "get_counter_value"}], handler)
    try:
        async with program.loopback_relays(tmp_path, [url]) as forward:
            assert forward is not None
            [[port, path]] = forward
            assert port == urlsplit(url).port
            with socket.socket() as listener, socket.socket(socket.AF_UNIX) as handoff:
                listener.bind(("127.0.0.1", 0))
                listener.listen(8)
                await asyncio.to_thread(handoff.connect, path)
                socket.send_fds(handoff, [b"listener"], [listener.fileno()])
                own_port = listener.getsockname()[1]
            body = json.dumps({"name": "get_counter_value", "arguments": {}}).encode()
            answer = await _post(own_port, urlsplit(url).path + "/call", body)
    finally:
        await tools.stop()
    assert json.loads(answer)["output"] == "7"
    assert [c["function"] for c in calls] == [{"name": "get_counter_value", "arguments": "{}"}]
    assert relayed == []


async def _never(call: Json) -> ToolResult:
    raise AssertionError("no call expected")


async def _post(port: int, path: str, body: bytes) -> bytes:
    """One HTTP/1.1 POST to 127.0.0.1:`port` (queued in its backlog until it is served); the
    reply's body."""
    async with asyncio.timeout(60):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        reply = await reader.read()
        writer.close()
    return reply.split(b"\r\n\r\n", 1)[1]
