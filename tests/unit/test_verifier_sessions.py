"""Sessions: TTL (injectable clock), cap, isolation, and tool-call error handling in the service."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import ToolCall
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.errors import SessionExists
from rollmesh.verifier.errors import SessionMismatch
from rollmesh.verifier.errors import SessionNotFound
from rollmesh.verifier.errors import ToolNotFound
from rollmesh.verifier.errors import TooManySessions
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
from rollmesh.verifier.sessions import SessionStore


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _session(sid: str, env: str = "e") -> Session:
    return Session(sid, env, Task({}), None)


def test_ttl_expiry_and_eviction_without_sleeping() -> None:
    clock = FakeClock()
    store = SessionStore(ttl_s=10, max_sessions=100, clock=clock)
    store.add(_session("a"))
    store.add(_session("b"))
    clock.now += 6
    store.get("a")  # touching a keeps it alive
    clock.now += 6
    with pytest.raises(SessionNotFound) as err:
        store.get("b")
    assert err.value.code == grpc.StatusCode.NOT_FOUND and "expired" in err.value.message
    assert store.get("a").id == "a"
    assert len(store) == 1 and store.evicted == 1
    clock.now += 10
    assert store.evict_expired() == 1 and len(store) == 0


def test_cap_close_and_duplicates() -> None:
    store = SessionStore(ttl_s=10, max_sessions=2, clock=FakeClock())
    store.add(_session("a"))
    store.add(_session("b"))
    with pytest.raises(TooManySessions) as err:
        store.add(_session("c"))
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2 sessions open, the limit is 2" in err.value.message
    with pytest.raises(SessionExists):
        store.reserve("a")
    store.close("a")
    with pytest.raises(SessionNotFound):
        store.close("a")
    with pytest.raises(SessionMismatch):
        store.get("b", "other-env")
    store.add(_session("c"))


def test_expired_sessions_free_capacity() -> None:
    clock = FakeClock()
    store = SessionStore(ttl_s=5, max_sessions=1, clock=clock)
    store.add(_session("a"))
    clock.now += 5
    store.add(_session("b"))  # "a" is evicted first
    assert len(store) == 1


@pytest.fixture
async def service() -> AsyncIterator[tuple[VerifierService, FakeClock]]:
    clock = FakeClock()
    cfg = replace(VerifierConfig(), session_ttl_s=30.0, max_sessions=3)
    cat = Catalog.from_config(RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False))
    svc = VerifierService.from_catalog(cfg, cat, clock=clock, entry_points=False)
    await svc.start()
    try:
        yield svc, clock
    finally:
        await svc.aclose()


def _counter_task(start: int, expected: int) -> str:
    return json.dumps({"expected_answer": expected, "verifier_metadata": {"initial_value": start}})


async def test_two_sessions_never_share_state(service: tuple[VerifierService, FakeClock]) -> None:
    svc, _ = service
    a = (await svc.seed_session("session_state", _counter_task(0, 2))).session
    b = (await svc.seed_session("session_state", _counter_task(0, 2))).session
    assert a.id != b.id
    for _ in range(2):
        await svc.call_tool(a.id, ToolCall("c", "increment_counter", '{"count": 1}'))
    out_b = await svc.call_tool(b.id, ToolCall("c", "get_counter_value", "{}"))
    assert out_b.output == "0"
    ra = await svc.verify(VerifyCall("session_state", _counter_task(0, 2), Response(), a.id))
    rb = await svc.verify(VerifyCall("session_state", _counter_task(0, 2), Response(), b.id))
    assert (ra.reward, rb.reward) == (1.0, 0.0)


async def test_service_ttl_and_cap(service: tuple[VerifierService, FakeClock]) -> None:
    svc, clock = service
    s = (await svc.seed_session("session_state", _counter_task(0, 1), "mine")).session
    with pytest.raises(SessionExists):
        await svc.seed_session("session_state", _counter_task(0, 1), "mine")
    await svc.seed_session("arithmetic", "{}")
    await svc.seed_session("arithmetic", "{}")
    with pytest.raises(TooManySessions) as err:
        await svc.seed_session("arithmetic", "{}")
    assert "3 sessions open, the limit is 3" in err.value.message
    clock.now += 31
    with pytest.raises(SessionNotFound):
        await svc.call_tool(s.id, ToolCall("c", "get_counter_value", "{}"))
    assert len(svc.sessions) == 0
    await svc.seed_session("arithmetic", "{}")


async def test_tool_errors_are_outputs_unknown_tool_is_not_found(
    service: tuple[VerifierService, FakeClock],
) -> None:
    svc, _ = service
    seeded = await svc.seed_session("single_tool_call", "{}")
    s, tools = seeded.session, seeded.tools
    assert [t.name for t in tools] == ["get_weather"] and not seeded.takes_turns
    for args in ["{bad json", "[1, 2]", '{"city": 5}', "{}", '{"city": "Atlantis"}']:
        out = await svc.call_tool(s.id, ToolCall("c1", "get_weather", args))
        assert out.is_error and out.call_id == "c1" and out.output.startswith("error:"), args
    ok = await svc.call_tool(s.id, ToolCall("c2", "get_weather", '{"city": "Tokyo"}'))
    assert (ok.output, ok.is_error) == ("sunny, 24°C", False)
    with pytest.raises(ToolNotFound) as err:
        await svc.call_tool(s.id, ToolCall("c3", "launch_rockets", "{}"))
    assert err.value.code == grpc.StatusCode.NOT_FOUND and "get_weather" in err.value.message
    await svc.close_session(s.id)
    with pytest.raises(SessionNotFound):
        await svc.call_tool(s.id, ToolCall("c4", "get_weather", '{"city": "Tokyo"}'))
