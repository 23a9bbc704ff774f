"""`is_stateless`: an environment with no tools that keeps the base `seed_session` needs no session."""

from __future__ import annotations

from typing import Any

from rollmesh.verifier import Environment
from rollmesh.verifier import EnvTurn
from rollmesh.verifier import Response
from rollmesh.verifier import Session
from rollmesh.verifier import Task
from rollmesh.verifier import VerifyResult
from rollmesh.verifier import tool
from rollmesh.verifier.service import is_stateless


class _Verifies(Environment):
    def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        return VerifyResult(1.0)


class _Seeds(_Verifies):
    async def seed_session(self, task: Task) -> Any:
        return {"n": 0}


class _HasTool(_Verifies):
    @tool
    async def ping(self, session: Session) -> str:
        """Ping."""
        return "pong"


class _InheritsSeed(_Seeds):
    """Overrides nothing itself, but its parent overrides seed_session."""


class _Steps(_Verifies):
    """Takes turns: its sessions are stepped, so it needs one."""

    async def step(self, session: Session, turn: Response) -> EnvTurn:
        return EnvTurn(done=True)


class _SubclassOfStateless(_Verifies):
    description = "still stateless"


def test_is_stateless() -> None:
    assert is_stateless(_Verifies) and is_stateless(_SubclassOfStateless)
    assert not is_stateless(_Seeds)
    assert not is_stateless(_HasTool)
    assert not is_stateless(_InheritsSeed)
    assert not is_stateless(_Steps)
