"""`mesh.aio.run_server` runs a server on the loop ROLLMESH_EVENT_LOOP names (uvloop when installed and
the process allows it), and the variable is parsed strictly; it raises the collector's threshold for
serving (mesh/heap.py) unless told not to."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from collections.abc import Iterator

import pytest

from rollmesh.mesh.aio import run_server
from rollmesh.mesh.config import ServerConfig
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.heap import SERVING_GC_THRESHOLD

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    """run_server tunes the collector of the process it runs in: here pytest's, restored after."""
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed in this environment")
def test_auto_and_uvloop_run_on_uvloop() -> None:
    assert run_server(_loop_module()).startswith("uvloop")
    assert run_server(_loop_module(), event_loop="uvloop").startswith("uvloop")


def test_asyncio_when_asked_or_when_the_process_does_not_allow_uvloop() -> None:
    assert run_server(_loop_module(), event_loop="asyncio").startswith("asyncio")
    assert run_server(_loop_module(), event_loop="auto", uvloop_ok=False).startswith("asyncio")


def test_the_result_comes_back() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    assert run_server(answer(), event_loop="asyncio") == 42


def test_event_loop_variable() -> None:
    assert ServerConfig.from_env("scheduler", environ={}).event_loop == "auto"
    assert (
        ServerConfig.from_env("scheduler", environ={"ROLLMESH_EVENT_LOOP": " AsyncIO "}).event_loop
        == "asyncio"
    )
    with pytest.raises(ConfigError, match="ROLLMESH_EVENT_LOOP='trio'"):
        ServerConfig.from_env("scheduler", environ={"ROLLMESH_EVENT_LOOP": "trio"})


def test_a_server_runs_with_the_serving_gc_threshold() -> None:
    gc.set_threshold(700, 10, 10)
    assert run_server(_gc_threshold(), event_loop="asyncio") == SERVING_GC_THRESHOLD


def test_gc_untouched_when_not_tuned() -> None:
    gc.set_threshold(700, 10, 10)
    assert run_server(_gc_threshold(), event_loop="asyncio", gc_tuned=False) == (700, 10, 10)


async def _gc_threshold() -> tuple[int, ...]:
    return gc.get_threshold()
