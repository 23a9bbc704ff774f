"""The verifier over real gRPC with the SDK: every RPC, error codes and ErrorInfo reasons, plugins."""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_health.v1 import health_pb2_grpc

from rollmesh.mesh.server import MeshServer
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry.roots import BUILTIN_ROOT
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client import AlreadyExistsError
from rollmesh_client import Client
from rollmesh_client import FailedPreconditionError
from rollmesh_client import InvalidArgumentError
from rollmesh_client import NotFoundError
from rollmesh_client import ResourceExhaustedError
from rollmesh_client._verifier import verify_request
from rollmesh_client.v1 import common_pb2

StartServer = Callable[..., Awaitable[MeshServer]]

ECHO = """
from rollmesh.verifier import Environment, Response, Session, Task, VerifyResult, tool

class Echo(Environment):
    \"\"\"Echo plugin.\"\"\"

    async def seed_session(self, task: Task) -> list[str]:
        return []

    @tool
    async def remember(self, session: Session, word: str) -> str:
        \"\"\"Remember a word.\"\"\"
        session.state.append(word)
        return ",".join(session.state)

    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        ok = response.final_text == task.prompt
        return VerifyResult(1.0 if ok else 0.0, {"echo": float(ok)}, response.final_text)
"""


def plugin_root(base: Path) -> Path:
    for name, src in {"echo": ECHO, "arithmetic": ECHO, "broken": "def f(:\n"}.items():
        d = base / "environments" / name
        d.mkdir(parents=True)
        (d / "env.py").write_text(textwrap.dedent(src))
    return base


@pytest.fixture
async def verifier(
    start_server: StartServer, tmp_path: Path
) -> AsyncIterator[tuple[Client, MeshServer, VerifierService]]:
    cfg = replace(VerifierConfig(), max_sessions=4, session_ttl_s=300.0)
    roots = RootsConfig(tmp_path, (plugin_root(tmp_path / "plugins"),), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(cfg, Catalog.from_config(roots), entry_points=False)
    await svc.start()
    server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
    client = await Client.connect(verifier=server.address, timeout_s=30)
    try:
        yield client, server, svc
    finally:
        await client.close()
        await svc.aclose()


async def test_list_get_and_plugins(verifier: tuple[Client, MeshServer, VerifierService]) -> None:
    c, _, _ = verifier
    first = await c.verifier.list(page_size=2)
    assert len(first.environments) == 2 and first.next_page_token
    names = [e.name async for e in c.verifier.environments(page_size=2)]
    assert names == sorted(names) and {"echo", "math", "code", "session_state", "single_tool_call"} <= set(
        names
    )
    assert "arithmetic" not in names  # collides with the plugin root's copy
    broken = {b.name: b.error for b in first.broken}
    assert set(broken) == {"arithmetic", "broken"}
    assert "defined in 2 places" in broken["arithmetic"] and broken["broken"].startswith("SyntaxError")
    env = await c.verifier.get("single_tool_call")
    (tool,) = env.tools
    assert tool.name == "get_weather" and json.loads(tool.parameters_json)["required"] == ["city"]
    assert env.example_dataset.endswith("single_tool_call/data/example.jsonl")
    echo = await c.verifier.get("echo")
    assert echo.source.endswith("plugins/environments/echo/env.py")

    with pytest.raises(FailedPreconditionError) as err:
        await c.verifier.get("arithmetic")
    assert err.value.reason == "ARTIFACT_COLLISION" and err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(FailedPreconditionError) as err:
        await c.verifier.verify("broken", "{}", "x")
    assert err.value.reason == "ENVIRONMENT_BROKEN"
    with pytest.raises(NotFoundError) as nf:
        await c.verifier.get("nope")
    assert nf.value.reason == "ENVIRONMENT_NOT_FOUND"


async def test_sessions_tools_verify_close(verifier: tuple[Client, MeshServer, VerifierService]) -> None:
    c, _, _ = verifier
    task = {"expected_answer": 3, "verifier_metadata": {"initial_value": 1}}
    seeded = await c.verifier.seed_session("session_state", task, session_id="rollout-0-0")
    assert seeded.session_id == "rollout-0-0" and seeded.ttl_seconds == 300.0
    assert sorted(t.name for t in seeded.tools) == ["get_counter_value", "increment_counter"]
    with pytest.raises(AlreadyExistsError) as ae:
        await c.verifier.seed_session("session_state", task, session_id="rollout-0-0")
    assert ae.value.reason == "SESSION_EXISTS"
    other = await c.verifier.seed_session("session_state", task)

    out = await c.verifier.call_tool(seeded.session_id, "increment_counter", {"count": 2}, call_id="c7")
    assert (out.tool_call_id, out.output, out.is_error) == ("c7", "3", False)
    bad = await c.verifier.call_tool(seeded.session_id, "increment_counter", "{nope")
    assert bad.is_error and "not valid JSON" in bad.output
    schema = await c.verifier.call_tool(seeded.session_id, "increment_counter", {"count": 1.5})
    assert schema.is_error and "must be integer" in schema.output
    with pytest.raises(NotFoundError) as nf:
        await c.verifier.call_tool(seeded.session_id, "rm_rf", {})
    assert nf.value.reason == "TOOL_NOT_FOUND"
    assert (await c.verifier.call_tool(other.session_id, "get_counter_value", {})).output == "1"

    r = await c.verifier.verify("session_state", task, "done", session_id=seeded.session_id)
    assert (r.reward, r.extracted_answer, dict(r.components)) == (1.0, "3", {"reached": 1.0})
    assert json.loads(r.details_json)["final_value"] == 3
    with pytest.raises(InvalidArgumentError) as ia:
        await c.verifier.verify("math", task, "x", session_id=seeded.session_id)
    assert ia.value.reason == "SESSION_ENVIRONMENT_MISMATCH"

    await c.verifier.close_session(seeded.session_id)
    for coro in (
        c.verifier.close_session(seeded.session_id),
        c.verifier.call_tool(seeded.session_id, "get_counter_value", {}),
        c.verifier.verify("session_state", task, "x", session_id=seeded.session_id),
    ):
        with pytest.raises(NotFoundError) as nf:
            await coro
        assert nf.value.reason == "SESSION_NOT_FOUND"

    with pytest.raises(InvalidArgumentError) as ia:
        await c.verifier.seed_session("session_state", "[1, 2]")
    assert ia.value.reason == "BAD_TASK"
    for _ in range(3):
        await c.verifier.seed_session("echo", "{}")
    with pytest.raises(ResourceExhaustedError) as re_:
        await c.verifier.seed_session("echo", "{}")
    assert re_.value.reason == "SESSION_LIMIT" and "4 sessions open, the limit is 4" in re_.value.message


async def test_hostile_json_is_an_answer_not_an_internal_error(
    verifier: tuple[Client, MeshServer, VerifierService],
) -> None:
    """JSON a model or a dataset wrote is parsed with every failure json.loads has: nesting past
    the recursion limit (RecursionError) and a number past int's 4300-digit limit (ValueError)
    were INTERNAL errors (a failed rollout, fail-fast after 20 in a row) instead of a tool error
    the model sees, a reward of 0, or BAD_TASK; a counter pushed past 4300 digits made the verify
    of session_state INTERNAL."""
    c, _, _ = verifier
    deep, huge = "[" * 100_000 + "]" * 100_000, "9" * 5000
    task = {"expected_answer": 3, "verifier_metadata": {"initial_value": 1}}
    sid = (await c.verifier.seed_session("session_state", task)).session_id
    for args in ('{"count": ' + deep + "}", '{"count": ' + huge + "}"):
        out = await c.verifier.call_tool(sid, "increment_counter", args)
        assert out.is_error and "arguments are not valid JSON" in out.output
    for _ in range(2):  # each under the digit limit; their sum would be past it
        out = await c.verifier.call_tool(sid, "increment_counter", {"count": int("9" * 4300)})
        assert out.is_error and "the counter must stay within" in out.output
    r = await c.verifier.verify("session_state", task, "done", session_id=sid)
    assert (r.reward, r.extracted_answer) == (0.0, "1")
    assert (await c.verifier.call_tool(sid, "increment_counter", {"count": 2})).output == "3"

    bad = common_pb2.ToolCall(id="c0", name="get_weather", arguments_json='{"city": ' + deep + "}")
    messages = [
        common_pb2.ChatMessage(role="assistant", tool_calls=[bad]),
        common_pb2.ChatMessage(role="assistant", content="foggy, 16°C"),
    ]
    r = await c.verifier.verify("single_tool_call", {"verifier_metadata": {}}, messages)
    assert r.reward == 0.0 and json.loads(r.details_json)["reason"] == "no valid get_weather call"

    for task_json in ('{"a": ' + deep + "}", '{"expected_answer": ' + huge + "}"):
        for call in (
            c.verifier.verify("math", task_json, "5"),
            c.verifier.seed_session("session_state", task_json),
        ):
            with pytest.raises(InvalidArgumentError) as err:
                await call
            assert err.value.reason == "BAD_TASK" and "task_json is not valid JSON" in err.value.message


async def test_verify_with_tool_messages_and_batch(
    verifier: tuple[Client, MeshServer, VerifierService],
) -> None:
    c, server, _ = verifier
    call = common_pb2.ToolCall(id="c0", name="get_weather", arguments_json='{"city": "Cairo"}')
    messages = [
        common_pb2.ChatMessage(role="assistant", tool_calls=[call]),
        common_pb2.ChatMessage(role="tool", tool_call_id="c0", content="hot and dry, 35°C"),
        common_pb2.ChatMessage(role="assistant", content="It is hot and dry, 35°C."),
    ]
    r = await c.verifier.verify("single_tool_call", {"verifier_metadata": {"city": "Cairo"}}, messages)
    assert r.reward == 1.0

    def arith(a: int, b: int) -> dict[str, object]:
        return {
            "responses_create_params": {"input": [{"role": "user", "content": f"What is {a} + {b}?"}]},
            "expected_answer": str(a + b),
        }

    reqs = [(f"ok{i}", verify_request("echo", arith(i, i), f"What is {i} + {i}?")) for i in range(20)]
    reqs.append(("wrong", verify_request("echo", arith(1, 1), "no")))
    reqs.append(("bad", verify_request("echo", "{oops", "x")))
    reqs.append(("missing", verify_request("nope", "{}", "x")))
    reqs.append(("collide", verify_request("arithmetic", "{}", "x")))
    got = {r.id: r async for r in c.verifier.verify_batch(reqs, timeout_s=60)}
    assert len(got) == 24
    assert all(got[f"ok{i}"].result.reward == 1.0 for i in range(20))
    assert got["wrong"].result.reward == 0.0
    assert got["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert got["missing"].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert got["collide"].error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    from google.rpc import error_details_pb2

    info = error_details_pb2.ErrorInfo()
    got["collide"].error.details[0].Unpack(info)
    assert info.reason == "ARTIFACT_COLLISION"

    async with grpc.aio.insecure_channel(server.address) as ch:
        health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_stateless_flag_and_verify_without_session(start_server: StartServer, tmp_path: Path) -> None:
    """`stateless`: no tools and no seed_session override; such an environment verifies with no session."""
    roots = RootsConfig(tmp_path, (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(VerifierConfig(), Catalog.from_config(roots), entry_points=False)
    await svc.start()
    server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
    c = await Client.connect(verifier=server.address, timeout_s=30)
    try:
        flags = {name: (await c.verifier.get(name)).stateless for name in STATELESS}
        assert flags == STATELESS
        listed = {e.name: e.stateless async for e in c.verifier.environments()}
        assert {k: listed[k] for k in STATELESS} == STATELESS
        task = {"responses_create_params": {"input": "What is 2 + 3?"}, "expected_answer": "5"}
        r = await c.verifier.verify("arithmetic", task, "5")  # no session_id: none needed
        assert r.reward == 1.0 and r.extracted_answer == "5" and len(svc.sessions) == 0
    finally:
        await c.close()
        await svc.aclose()


# What each built-in overrides: arithmetic/math/code only `verify`; session_state `seed_session` and
# tools; single_tool_call a tool (and no seed_session).
STATELESS = {
    "arithmetic": True,
    "math": True,
    "code": True,
    "session_state": False,
    "single_tool_call": False,
}
