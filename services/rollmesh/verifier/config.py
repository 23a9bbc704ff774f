"""Verifier configuration, read once from the environment (see mesh/config.py's ENV_VARS)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field

from rollmesh.mesh.config import NO_FLAGS
from rollmesh.mesh.config import ServerConfig
from rollmesh.mesh.config import ServerFlags
from rollmesh.mesh.config import read
from rollmesh.mesh.config import read_fields
from rollmesh.mesh.config import service_addr
from rollmesh.mesh.config import setting
from rollmesh.mesh.errors import ConfigError
from rollmesh.procedural.scoring import READINGS
from rollmesh.registry.roots import RootsConfig

ISOLATION_MODES = ("auto", "namespaces", "process")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one sandboxed run of untrusted code."""

    wall_s: float = setting("ROLLMESH_VERIFIER_SANDBOX_WALL_S")
    cpu_s: int = setting("ROLLMESH_VERIFIER_SANDBOX_CPU_S")
    memory_mb: int = setting("ROLLMESH_VERIFIER_SANDBOX_MEMORY_MB")
    nproc: int = setting("ROLLMESH_VERIFIER_SANDBOX_NPROC")
    fsize_mb: int = setting("ROLLMESH_VERIFIER_SANDBOX_FSIZE_MB")
    output_kb: int = setting("ROLLMESH_VERIFIER_SANDBOX_OUTPUT_KB")


@dataclass(frozen=True)
class SandboxConfig:
    """`isolation`: "auto" (namespaces; when unavailable, refuse to start unless
    `allow_unsafe_process`, then "process"), "namespaces", or "process" (needs
    `allow_unsafe_process`: the operator's explicit, logged opt-in)."""

    isolation: str = setting("ROLLMESH_VERIFIER_SANDBOX_ISOLATION")
    concurrency: int = setting("ROLLMESH_VERIFIER_SANDBOX_CONCURRENCY")
    allow_unsafe_process: bool = setting("ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS")
    limits: SandboxLimits = field(default_factory=SandboxLimits)


@dataclass(frozen=True)
class VerifierConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    roots: RootsConfig | None = None
    session_ttl_s: float = setting("ROLLMESH_VERIFIER_SESSION_TTL_S")
    max_sessions: int = setting("ROLLMESH_VERIFIER_MAX_SESSIONS")
    verify_timeout_s: float = setting("ROLLMESH_VERIFIER_VERIFY_TIMEOUT_S")
    workers: int = setting("ROLLMESH_VERIFIER_WORKERS")
    batch_concurrency: int = setting("ROLLMESH_VERIFIER_BATCH_CONCURRENCY")
    math_timeout_s: float = setting("ROLLMESH_VERIFIER_MATH_TIMEOUT_S")
    math_judge: bool = setting("ROLLMESH_VERIFIER_MATH_JUDGE")
    math_judge_model: str = setting("ROLLMESH_VERIFIER_MATH_JUDGE_MODEL")
    # How the reasoning_gym environment reads the answer: "final" (the final assistant message,
    # outside think blocks) or "nemo_gym" (NeMo Gym's server's reading): procedural/scoring.py.
    reasoning_gym_reading: str = setting("ROLLMESH_VERIFIER_REASONING_GYM_READING")
    # The math judge's gateway: ROLLMESH_GATEWAY_ADDR, else the config table's default.
    gateway_addr: str = field(default_factory=lambda: service_addr("gateway"))
    # Where verifiers judges ask (the gateway's OpenAI facade: `/v1` base URL), and which model ("":
    # the gateway's default); "" judge_url: judges keep their own endpoints.
    judge_url: str = setting("ROLLMESH_VERIFIER_JUDGE_URL")
    judge_model: str = setting("ROLLMESH_VERIFIER_JUDGE_MODEL")
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        checks = {
            "ROLLMESH_VERIFIER_SESSION_TTL_S": self.session_ttl_s > 0,
            "ROLLMESH_VERIFIER_MAX_SESSIONS": self.max_sessions > 0,
            "ROLLMESH_VERIFIER_VERIFY_TIMEOUT_S": self.verify_timeout_s > 0,
            "ROLLMESH_VERIFIER_WORKERS": self.workers > 0,
            "ROLLMESH_VERIFIER_BATCH_CONCURRENCY": self.batch_concurrency > 0,
            "ROLLMESH_VERIFIER_MATH_TIMEOUT_S": self.math_timeout_s > 0,
            "ROLLMESH_VERIFIER_SANDBOX_CONCURRENCY": self.sandbox.concurrency > 0,
            "ROLLMESH_VERIFIER_SANDBOX_WALL_S": self.sandbox.limits.wall_s > 0,
            "ROLLMESH_VERIFIER_SANDBOX_CPU_S": self.sandbox.limits.cpu_s > 0,
            "ROLLMESH_VERIFIER_SANDBOX_MEMORY_MB": self.sandbox.limits.memory_mb >= 32,
            "ROLLMESH_VERIFIER_SANDBOX_NPROC": self.sandbox.limits.nproc > 0,
            "ROLLMESH_VERIFIER_SANDBOX_FSIZE_MB": self.sandbox.limits.fsize_mb >= 0,
            "ROLLMESH_VERIFIER_SANDBOX_OUTPUT_KB": self.sandbox.limits.output_kb > 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"out of range: {', '.join(bad)} (sizes and counts must be positive)")
        if self.reasoning_gym_reading not in READINGS:
            raise ConfigError(
                f"ROLLMESH_VERIFIER_REASONING_GYM_READING={self.reasoning_gym_reading!r}: "
                f"use one of {', '.join(READINGS)}"
            )
        if self.sandbox.isolation not in ISOLATION_MODES:
            raise ConfigError(
                f"ROLLMESH_VERIFIER_SANDBOX_ISOLATION={self.sandbox.isolation!r}: "
                f"use one of {', '.join(ISOLATION_MODES)}"
            )

    @classmethod
    def from_env(
        cls, flags: ServerFlags = NO_FLAGS, *, environ: Mapping[str, str] | None = None
    ) -> VerifierConfig:
        return read_fields(
            cls,
            environ,
            server=ServerConfig.from_env("verifier", flags, environ=environ),
            roots=RootsConfig.from_env(environ),
            gateway_addr=service_addr("gateway", environ),
            judge_url=str(read("ROLLMESH_VERIFIER_JUDGE_URL", environ)) or facade_url(environ),
            sandbox=read_fields(
                SandboxConfig,
                environ,
                isolation=str(read("ROLLMESH_VERIFIER_SANDBOX_ISOLATION", environ)).strip().lower(),
                limits=read_fields(SandboxLimits, environ),
            ),
        )


def facade_url(environ: Mapping[str, str] | None = None) -> str:
    """The gateway's OpenAI facade as a base URL: ROLLMESH_GATEWAY_ADDR's host at
    ROLLMESH_OPENAI_HTTP_PORT ("" when that port is -1, off, or 0, unknown)."""
    port = int(read("ROLLMESH_OPENAI_HTTP_PORT", environ))
    if port <= 0:
        return ""
    host = service_addr("gateway", environ).rsplit(":", 1)[0] or "127.0.0.1"
    return f"http://{host}:{port}/v1"
