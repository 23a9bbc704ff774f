"""A port another process listens on, for `rollmesh serve` (a service, `openenv`) and `rollmesh up`:
one `error:` line naming the address, exit 2 (a user error, docs/running.md), no traceback and nothing
left started."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.procs import run_cli


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port this test listens on while the command tries it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _one_error_line(code: int, err: str, needle: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err, err
    assert lines[-1].startswith("error: could not bind") and needle in lines[-1], err
    assert "is the port in use?" in lines[-1], err
    assert sum(line.startswith("error:") for line in lines) == 1, err


async def test_serve_on_a_taken_port_is_one_line_exit_2(taken: int) -> None:
    code, _, err = await run_cli("serve", "registry", "--port", str(taken))
    _one_error_line(code, err, f"127.0.0.1:{taken}")
    assert len(err.strip().splitlines()) == 1, err  # nothing was started, so nothing else is logged


async def test_the_gateway_refuses_a_taken_http_port_before_it_starts(taken: int) -> None:
    code, _, err = await run_cli(
        "serve", "gateway", "--backend", "fake", "--port", "0", "--http-port", str(taken)
    )
    _one_error_line(code, err, f"the OpenAI HTTP facade 127.0.0.1:{taken}")
    assert "server_started" not in err, err


async def test_serve_openenv_refuses_a_taken_port_before_it_starts_a_verifier(taken: int) -> None:
    code, _, err = await run_cli("serve", "openenv", "--environment", "arithmetic", "--port", str(taken))
    _one_error_line(code, err, f"the OpenEnv server 127.0.0.1:{taken}")
    assert "starting a verifier" not in err, err


async def test_up_checks_every_port_before_it_starts_a_service(taken: int) -> None:
    """The facade's port is taken (or, where another process holds one of 50051-50054, that one):
    either way no service was started."""
    code, _, err = await run_cli("up", "--backend", "fake", "--http-port", str(taken))
    _one_error_line(code, err, "(stop what holds it, or pass --ephemeral)")
    assert "[up]" not in err and "server_started" not in err, err
