"""Helpers for testing environments without a server (used by every `tests/test_env.py`)."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from rollmesh.verifier import EnvContext
from rollmesh.verifier import Environment
from rollmesh.verifier import Message
from rollmesh.verifier import Response
from rollmesh.verifier import SandboxConfig
from rollmesh.verifier import SandboxLimits
from rollmesh.verifier import Seeded
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import ToolCall
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier import VerifyResult
from rollmesh.verifier.loader import environment_class
from rollmesh.verifier.loader import import_file
from rollmesh.verifier.workers import WorkerPool

TEST_CONFIG = VerifierConfig(
    workers=1,
    math_timeout_s=20.0,
    sandbox=SandboxConfig(concurrency=2, limits=SandboxLimits(wall_s=5.0, cpu_s=3, memory_mb=256)),
)


@asynccontextmanager
async def load_env(folder: Path | str, config: VerifierConfig | None = None) -> AsyncIterator[Environment]:
    """Load `folder/env.py`, start the environment, and close it (and its workers) afterwards."""
    path = Path(folder)
    cfg = config or TEST_CONFIG
    cls = environment_class(import_file(path / "env.py"))
    pool = WorkerPool(cfg.workers, name=f"{path.name}-test-workers")
    env = cls(EnvContext(name=path.name, path=path, config=cfg, workers=pool))
    await env.start()
    try:
        yield env
    finally:
        await env.aclose()
        await pool.aclose()


async def check(
    env: Environment, t: Task, response: Response, session: Session | None = None
) -> VerifyResult:
    """`env.verify(...)`, awaited when it is async (the service runs a plain def in a thread)."""
    out = env.verify(t, response, session)
    return await out if inspect.isawaitable(out) else out


def task(expected: Any = None, prompt: str = "", **extra: Any) -> Task:
    row: dict[str, Any] = {"responses_create_params": {"input": [{"role": "user", "content": prompt}]}}
    if expected is not None:
        row["expected_answer"] = expected
    row.update(extra)
    return Task(row)


def answer(text: str) -> Response:
    return Response.from_text(text)


def call(name: str, arguments: Any, call_id: str = "call_0") -> ToolCall:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(call_id, name, args)


def with_tool_turn(call_: ToolCall, output: str, final: str) -> Response:
    """A response that called one tool, got `output`, then answered `final`."""
    return Response(
        (
            Message("assistant", "", (call_,)),
            Message("tool", output, tool_call_id=call_.id, name=call_.name),
            Message("assistant", final),
        )
    )


async def seeded(env: Environment, t: Task, session_id: str = "s") -> Session:
    """A session as the service seeds it: a `Seeded` answer's state becomes `session.state` (its
    messages are `opening(env, t)`'s)."""
    state = await env.seed_session(t)
    return Session(session_id, type(env).__name__, t, state.state if isinstance(state, Seeded) else state)


async def opening(env: Environment, t: Task) -> tuple[Message, ...]:
    """The messages a session of `env` for `t` starts with (none unless `seed_session` returns `Seeded`)."""
    state = await env.seed_session(t)
    return state.messages if isinstance(state, Seeded) else ()


def rows(folder: Path | str) -> list[dict[str, Any]]:
    """The rows of `folder/data/example.jsonl`."""
    text = (Path(folder) / "data" / "example.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


__all__ = [
    "TEST_CONFIG",
    "answer",
    "call",
    "check",
    "load_env",
    "opening",
    "rows",
    "seeded",
    "task",
    "with_tool_turn",
]
