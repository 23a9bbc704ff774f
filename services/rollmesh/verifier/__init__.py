"""The environment verifier: environments (tools, session state, verify -> reward) behind gRPC.

Plugins import the public API from here::

    from rollmesh.verifier import Environment, Response, Session, Task, VerifyResult, tool

A row that cannot be scored (no usable `expected_answer`) raises `BadTask` from `verify`: the rollout
fails with class BAD_TASK instead of recording a reward of 0 for an answer nobody could judge. A
checker that overruns its time raises `CheckTimeout` (CHECK_TIMEOUT), one that breaks `CheckFailed`
(CHECK_FAILED): both are retried, neither is a reward of 0. A `verify` that needs the rollout's
session and got none raises `SessionRequired` (SESSION_REQUIRED).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollmesh.verifier.config import SandboxConfig, SandboxLimits, VerifierConfig
from rollmesh.verifier.environment import (
    EnvContext,
    Environment,
    Message,
    Response,
    Session,
    Task,
    ToolCall,
    ToolError,
    ToolOutput,
    ToolSpec,
    VerifyResult,
    tool,
)
from rollmesh.verifier.errors import BadTask, CheckFailed, CheckTimeout, SessionRequired

if TYPE_CHECKING:
    from rollmesh.mesh.server import ServiceBinding
    from rollmesh.verifier.service import VerifierService

SessionState = Session  # the name for per-session state


def binding(service: VerifierService) -> ServiceBinding:
    """The verifier's servicer, ready for `mesh.build_server`."""
    from rollmesh.mesh.server import ServiceBinding
    from rollmesh.verifier.servicer import VerifierServicer
    from rollmesh_client.v1 import verifier_pb2, verifier_pb2_grpc

    return ServiceBinding.of(
        verifier_pb2, verifier_pb2_grpc, "EnvironmentVerifier", VerifierServicer(service)
    )


__all__ = [
    "BadTask",
    "CheckFailed",
    "CheckTimeout",
    "EnvContext",
    "Environment",
    "Message",
    "Response",
    "SandboxConfig",
    "SandboxLimits",
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
    "binding",
    "tool",
]
