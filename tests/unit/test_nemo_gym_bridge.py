"""The NeMo Gym bridge attached by URL, against a server speaking the resources-server protocol on
loopback (tests/nemo_gym_fake.py): the session cookie on every call, nulls dropped, tool results
whatever the status, the verdict's extra fields, close, the replay behind a session-less verify, and
each server fault as a named error, never a reward."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from rollmesh.mesh.chat import Message
from rollmesh.mesh.chat import ToolCall
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import Response
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.bridges.nemo_gym import drop_nulls
from rollmesh.verifier.bridges.nemo_gym import openapi_tools
from rollmesh.verifier.errors import BadTask
from rollmesh.verifier.errors import EnvServerBadReply
from rollmesh.verifier.errors import EnvServerError
from rollmesh.verifier.errors import EnvServerTimeout
from rollmesh.verifier.errors import EnvServerUnreachable
from rollmesh.verifier.errors import ReverifyUnsupported
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
from tests.nemo_gym_fake import FakeGym
from tests.nemo_gym_fake import counter_row
from tests.nemo_gym_fake import fake_gym


@asynccontextmanager
async def bridged(tmp_path: Path, url: str, **extra: object) -> AsyncIterator[VerifierService]:
    folder = tmp_path / "environments" / "counter"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f'server = "example_session_state_mgmt"\nurl = "{url}"'] + [
        f"{k} = {v!r}" for k, v in extra.items()
    ]
    (folder / "nemo_gym.toml").write_text("\n".join(lines) + "\n")
    roots = RootsConfig(Path("/nonexistent"), (tmp_path,), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await svc.start()
    try:
        yield svc
    finally:
        await svc.aclose()


def episode(*counts: int) -> tuple[ToolCall, ...]:
    return tuple(
        ToolCall(f"call_{i}", "increment_counter", json.dumps({"count": c})) for i, c in enumerate(counts)
    )


def transcript(calls: tuple[ToolCall, ...], outputs: list[str]) -> Response:
    msgs = [Message("assistant", "", calls)]
    msgs += [Message("tool", out, tool_call_id=c.id) for c, out in zip(calls, outputs, strict=True)]
    return Response((*msgs, Message("assistant", "done")))


async def test_an_episode_keeps_its_session_cookie_on_every_call(tmp_path: Path) -> None:
    gym = FakeGym(verify_extra={"mask_sample": False, "failure_kind": None, "judge_calls": 0})
    async with fake_gym(gym) as url, bridged(tmp_path, url) as svc:
        row = counter_row(3, 6)
        seeded = await svc.seed_session("counter", json.dumps(row), "job/0/0")
        session = seeded.session
        assert seeded.tools == []  # the row's own tools are the model's (the agent merges them)
        calls = episode(1, 2)
        outs = [await svc.call_tool(session.id, c) for c in calls]
        assert [(o.output, o.is_error) for o in outs] == [('{"success": true}', False)] * 2
        result = await svc.verify(
            VerifyCall("counter", json.dumps(row), transcript(calls, [o.output for o in outs]), session.id)
        )
        await svc.close_session(session.id)
    assert result.reward == 1.0 and result.components == {"count_ok": 1.0} and result.extracted_answer == "6"
    assert result.details == {"mask_sample": False, "failure_kind": None, "judge_calls": 0}
    assert not result.masked
    # the seed set the cookie; each later call carried it back (127.0.0.1 included)
    assert gym.calls[0] == ("/seed_session", False) and all(ok for _, ok in gym.calls[1:])
    assert gym.closed == ["job-0-0"]


async def test_a_verdict_the_server_masks_is_masked_not_a_zero(tmp_path: Path) -> None:
    gym = FakeGym(
        verify_extra={"mask_sample": True, "failure_kind": "judge_failed", "failure_reason": "judge 503"}
    )
    async with fake_gym(gym) as url, bridged(tmp_path, url) as svc:
        row = json.dumps(counter_row(0, 5))
        session = (await svc.seed_session("counter", row)).session
        result = await svc.verify(VerifyCall("counter", row, Response.from_text("5"), session.id))
    assert result.masked and result.details["failure_kind"] == "judge_failed"
    assert result.details["failure_reason"] == "judge 503"


async def test_envs_show_lists_the_servers_tool_routes(tmp_path: Path) -> None:
    async with fake_gym(FakeGym()) as url, bridged(tmp_path, url) as svc:
        info = svc.describe("counter")
    assert [t.name for t in info.tools] == ["get_counter_value", "increment_counter"]
    assert info.tools[1].parameters["required"] == ["count"] and not info.stateless
    assert info.source.endswith("nemo_gym.toml")


async def test_tool_results_are_the_body_whatever_the_status(tmp_path: Path) -> None:
    async with fake_gym(FakeGym()) as url, bridged(tmp_path, url) as svc:
        session = (await svc.seed_session("counter", json.dumps(counter_row(0, 0)))).session
        missing = await svc.call_tool(session.id, ToolCall("a", "launch_rockets", "{}"))
        bad_args = await svc.call_tool(session.id, ToolCall("b", "increment_counter", "{not json"))
        protocol = await svc.call_tool(session.id, ToolCall("c", "verify", "{}"))
        escape = await svc.call_tool(session.id, ToolCall("d", "../seed_session", "{}"))
    assert (json.loads(missing.output), missing.is_error) == ({"detail": "Not Found"}, True)
    assert bad_args.is_error and "Invalid tool call arguments" in json.loads(bad_args.output)["error"]
    assert protocol.is_error and escape.is_error and "no tool named" in protocol.output


async def test_a_row_the_server_refuses_is_bad_task(tmp_path: Path) -> None:
    async with fake_gym(FakeGym()) as url, bridged(tmp_path, url) as svc:
        with pytest.raises(BadTask) as err:
            await svc.seed_session("counter", json.dumps({"responses_create_params": {"input": "x"}}))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "422" in err.value.message


@pytest.mark.parametrize(
    ("fault", "error", "reason"),
    [
        ("500", EnvServerError, "ENV_SERVER_ERROR"),
        ("garbage", EnvServerBadReply, "ENV_SERVER_BAD_REPLY"),
        ("no_reward", EnvServerBadReply, "ENV_SERVER_BAD_REPLY"),
        ("hang", EnvServerTimeout, "ENV_SERVER_TIMEOUT"),
    ],
)
async def test_a_verify_the_server_botches_is_a_named_failure_never_a_reward(
    tmp_path: Path, fault: str, error: type[Exception], reason: str
) -> None:
    gym = FakeGym(faults={"verify": fault})
    async with fake_gym(gym) as url, bridged(tmp_path, url, timeout_s=0.5) as svc:
        row = json.dumps(counter_row(6, 6))
        session = (await svc.seed_session("counter", row)).session
        with pytest.raises(error) as err:
            await svc.verify(VerifyCall("counter", row, Response.from_text("6"), session.id))
    assert getattr(err.value, "reason", "") == reason


async def test_a_server_that_is_down_is_listed_broken_until_it_answers(tmp_path: Path) -> None:
    gym = FakeGym()
    async with fake_gym(gym) as url:
        pass  # served, then stopped: the port refuses
    async with bridged(tmp_path, url) as svc:
        with pytest.raises(EnvServerUnreachable) as err:
            await svc.seed_session("counter", json.dumps(counter_row(0, 0)))
        _, broken = svc.list_environments()
        assert [b.name for b in broken] == ["counter"] and "Cannot connect" in broken[0].error
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_server_that_comes_up_after_the_verifier_leaves_broken_with_its_tools(
    tmp_path: Path,
) -> None:
    """A compose stack starts the server and the verifier at once: the server is probed until it
    answers, then listed with its tool routes, before any session."""
    gym = FakeGym()
    async with fake_gym(gym) as url:
        pass  # its port, free again
    port = int(url.rsplit(":", 1)[1])
    async with bridged(tmp_path, url) as svc:
        _, broken = svc.list_environments()
        assert [b.name for b in broken] == ["counter"]
        async with fake_gym(gym, port):
            deadline = asyncio.get_running_loop().time() + 30
            while svc.list_environments()[1]:
                assert asyncio.get_running_loop().time() < deadline, "still broken 30 s after it came up"
                await asyncio.sleep(0.05)
            infos, _ = svc.list_environments()
    (counter,) = [i for i in infos if i.name == "counter"]
    assert {t.name for t in counter.tools} == {"increment_counter", "get_counter_value"}
    assert not [path for path, _ in gym.calls if path == "/seed_session"], "listed without a session"


async def test_a_verify_without_a_session_replays_the_executed_calls(tmp_path: Path) -> None:
    gym = FakeGym()
    async with fake_gym(gym) as url, bridged(tmp_path, url) as svc:
        row = json.dumps(counter_row(3, 15))
        calls = (*episode(5, 7), ToolCall("never", "increment_counter", '{"count": 100}'))
        # the last call has no output: the rollout ended at it, it never ran, it is not replayed
        msgs = [Message("assistant", "", calls), Message("tool", "ok", tool_call_id="call_0")]
        right = Response((*msgs, Message("tool", "ok", tool_call_id="call_1")))
        wrong = Response(tuple(msgs))
        got = [(await svc.verify(VerifyCall("counter", row, r))).reward for r in (right, wrong)]
    assert got == [1.0, 0.0]
    assert len(gym.closed) == 2


async def test_a_server_that_cannot_reverify_says_so(tmp_path: Path) -> None:
    async with fake_gym(FakeGym(reverify_mode="unsupported")) as url, bridged(tmp_path, url) as svc:
        with pytest.raises(ReverifyUnsupported):
            await svc.verify(VerifyCall("counter", json.dumps(counter_row(0, 0)), Response.from_text("0")))


def test_nulls_are_dropped_but_tool_schemas_kept() -> None:
    params = {
        "input": [{"role": "user", "content": "x", "id": None}],
        "top_p": None,
        "tools": [{"default": None}],
    }
    assert drop_nulls(params) == {"input": [{"role": "user", "content": "x"}], "tools": [{"default": None}]}


def test_openapi_tools_skip_the_protocol_and_catch_all_routes() -> None:
    spec = {
        "paths": {"/verify": {"post": {}}, "/{path}": {"post": {}}, "/search": {"post": {"summary": "S"}}}
    }
    assert [(t.name, t.description) for t in openapi_tools(spec)] == [("search", "S")]


async def test_a_large_answer_is_read_whole() -> None:
    """NeMo Gym 0.7.0's OpenAPI documents are ~185 kB: one read gave the first 128 kB, the document
    did not parse, and the bridge knew none of the server's routes (a gymnasium server's /reset)."""
    from aiohttp import web

    from rollmesh.verifier.bridges.http_bridge import HttpBridge
    from tests.http_apps import serve_app

    body = json.dumps({"paths": {f"/tool_{i}": {"post": {"description": "x" * 200}} for i in range(2000)}})

    async def big(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/openapi.json", big)
    async with serve_app(app) as url:
        bridge = HttpBridge("big", lambda: url, timeout_s=30)
        await bridge.open()
        try:
            reply = await bridge.get("/openapi.json")
        finally:
            await bridge.aclose()
    assert len(body) > 400_000 and reply.ok and reply.text == body


async def test_a_call_that_finds_no_server_waits_for_the_sidecar_then_gives_up() -> None:
    """A managed server may be restarting: each connection failure waits for its sidecar to be ready
    (READY_TIMEOUT_S each time) before the next try; a sidecar that does not come back ends the call
    as EnvServerUnreachable after the first wait."""
    import socket

    from rollmesh.verifier.bridges.http_bridge import READY_TIMEOUT_S
    from rollmesh.verifier.bridges.http_bridge import HttpBridge

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    waits: list[float] = []

    async def wait_ready(timeout_s: float) -> bool:
        waits.append(timeout_s)
        return len(waits) < 2  # "ready" once, then not again

    bridge = HttpBridge("gone", lambda: url, timeout_s=30, wait_ready=wait_ready)
    await bridge.open()
    try:
        with pytest.raises(EnvServerUnreachable):
            await bridge.get("/health")
    finally:
        await bridge.aclose()
    assert READY_TIMEOUT_S == 60.0 and waits == [READY_TIMEOUT_S, READY_TIMEOUT_S]
    assert bridge.down
