"""The environment verifier: environments (tools, session state, verify -> reward) behind gRPC.

Plugins import the public API from here::

    from rollmesh.verifier import Environment, Response, Session, Task, VerifyResult, tool

An environment that answers assistant turns (a game, a user simulator) overrides `step` and returns
`EnvTurn`s; `seed_session` may return `Seeded` to start the episode with messages (environment.py).

A row that cannot be scored (no usable `expected_answer`) raises `BadTask` from `verify`: the rollout
fails with class BAD_TASK instead of recording a reward of 0 for an answer nobody could judge. A
checker that overruns its time raises `CheckTimeout` (CHECK_TIMEOUT), one that breaks `CheckFailed`
(CHECK_FAILED): both are retried, neither is a reward of 0. A `verify` that needs the rollout's
session and got none raises `SessionRequired` (SESSION_REQUIRED).
"""

from __future__ import annotations

from rollmesh.verifier.config import SandboxConfig
from rollmesh.verifier.config import SandboxLimits
from rollmesh.verifier.config import VerifierConfig
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import Environment
from rollmesh.verifier.environment import EnvTurn
from rollmesh.verifier.environment import Message
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import Seeded
from rollmesh.verifier.environment import Session
from rollmesh.verifier.environment import Task
from rollmesh.verifier.environment import ToolCall
from rollmesh.verifier.environment import ToolOutput
from rollmesh.verifier.environment import ToolSpec
from rollmesh.verifier.environment import VerifyResult
from rollmesh.verifier.environment import tool
from rollmesh.verifier.errors import BadTask
from rollmesh.verifier.errors import CheckFailed
from rollmesh.verifier.errors import CheckTimeout
from rollmesh.verifier.errors import SessionRequired
from rollmesh.verifier.errors import ToolError

SessionState = Session  # the name for per-session state


__all__ = [
    "BadTask",
    "CheckFailed",
    "CheckTimeout",
    "EnvContext",
    "EnvTurn",
    "Environment",
    "Message",
    "Response",
    "SandboxConfig",
    "SandboxLimits",
    "Seeded",
    "Session",
    "SessionRequired",
    "SessionState",
    "Task",
    "ToolCall",
    "ToolError",
    "ToolOutput",
    "ToolSpec",
    "VerifierConfig",
    "VerifyResult",
    "tool",
]
