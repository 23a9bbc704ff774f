"""Every `ROLLMESH_*` environment variable in one table: its default, doc and parser (by default type).

Read once into frozen dataclasses and passed down; nothing else reads `os.environ` for these.
Precedence everywhere: CLI flag > environment variable > default.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

from rollmesh.mesh.errors import ConfigError
from rollmesh_client._client import DEFAULT_PORTS as DEFAULT_PORTS  # the one table, also the SDK's

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(name: str, raw: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off (any case); anything else is a ConfigError naming `name`."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


# Every number a ROLLMESH_* variable holds is a count, size, port or seconds: 0 or more, and finite (a
# NaN or negative one was a traceback at start, or a limit that never held).


def parse_int(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} is negative; it must be 0 or more")
    return value


def parse_http_port(name: str, raw: str) -> int:
    """A port, or -1 for off."""
    if raw.strip() == "-1":
        return -1
    value = parse_int(name, raw)
    if value >= 65536:
        raise ConfigError(f"{name}={raw!r} is not a port (0-65535, or -1 for off)")
    return value


def parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not 0 <= value < math.inf:  # NaN too
        raise ConfigError(f"{name}={raw!r} is not a finite number of 0 or more")
    return value


def parse_address(name: str, raw: str) -> str:
    """host:port (no scheme). A URL here is the usual mistake, so say so."""
    value = raw.strip()
    if "://" in value:
        raise ConfigError(f"{name}={raw!r} looks like a URL; give host:port, e.g. 127.0.0.1:50051")
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{name}={raw!r} is not host:port (port 0-65535)")
    return value


def parse_event_loop(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"{name}={raw!r} is not an event loop: use auto, uvloop or asyncio")
    return value


def parse_str(name: str, raw: str) -> str:
    del name
    return raw


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: Any
    doc: str
    # A secret's value is never printed (`rollmesh config` shows only that it is set).
    secret: bool = False
    parser: Callable[[str, str], Any] | None = None  # None: the parser of the default's type

    @property
    def parse(self) -> Callable[[str, str], Any]:
        """Parses a raw value; a ConfigError names the variable and what is allowed."""
        return self.parser or _PARSERS[type(self.default)]


_PARSERS: dict[type, Callable[[str, str], Any]] = {
    bool: parse_bool,
    int: parse_int,
    float: parse_float,
    str: parse_str,
}


OPENAI_HTTP_PORT = 8000
# `rollmesh up --metrics`: each service's Prometheus endpoint (docs/observability.md).
DEFAULT_METRICS_PORTS = {"registry": 9461, "verifier": 9462, "gateway": 9463, "scheduler": 9464}

ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in [
        EnvVar("ROLLMESH_ROOT", "", "The last artifact root (default: the built-in root)."),
        # Read by the SDK's verl agent loop (rollmesh_client/verl.py; docs/training.md), in the trainer.
        EnvVar(
            "ROLLMESH_VERL_ENVIRONMENT",
            "",
            "verl agent loop: the environment of samples whose extra_info names none.",
        ),
        EnvVar(
            "ROLLMESH_VERL_OUTPUT_DIR", "runs/verl", "verl agent loop: where the scheduler writes its jobs."
        ),
        EnvVar(
            "ROLLMESH_VERL_ROWS_DIR",
            "",
            "verl agent loop: where each sample's one-row dataset is written, a path the scheduler reads"
            " too (default: the temp folder).",
        ),
        EnvVar(
            "ROLLMESH_EXTRA_ROOTS",
            "",
            "Artifact roots searched after the working directory, os.pathsep-separated, in order.",
        ),
        EnvVar(
            "ROLLMESH_ALLOW_ROOT_OVERRIDE",
            False,
            "A name in two roots resolves to the earliest root instead of an ARTIFACT_COLLISION error.",
        ),
        EnvVar(
            "ROLLMESH_API_KEY",
            "",
            "Bearer token every RPC must carry (health and reflection exempt); the SDK, the CLI, the"
            " services' own calls and a trainer's SinkServer use it too.",
            secret=True,
        ),
        EnvVar(
            "ROLLMESH_MAX_MESSAGE_MB",
            64.0,
            "Largest gRPC message (MiB) servers and clients send or take; a bigger request item is refused"
            " on its own, a bigger dataset row at submit, a bigger OpenAI HTTP body with 413 (read by"
            " rollmesh_client.max_message_bytes).",
        ),
        EnvVar("ROLLMESH_LOG_LEVEL", "info", "debug, info, warning or error."),
        EnvVar(
            "ROLLMESH_LOG_JSON",
            None,
            "Force JSON logs on or off (default: JSON unless a TTY).",
            parser=parse_bool,
        ),
        EnvVar(
            "ROLLMESH_LOG_MAX_LINE_BYTES",
            16384,
            "Longest log line a service writes; longer ones end in ...[truncated N bytes].",
        ),
        EnvVar("ROLLMESH_LOG_LOCALS", False, "Tracebacks in logs show frame locals (off: secrets)."),
        EnvVar(
            "ROLLMESH_RESTART",
            "on-failure",
            "`rollmesh up` restart policy for a child that dies: no, on-failure or always.",
        ),
        EnvVar("ROLLMESH_RESTART_MAX", 5, "`rollmesh up`: restarts of one service allowed per window."),
        EnvVar(
            "ROLLMESH_RESTART_WINDOW_S",
            300.0,
            "`rollmesh up`: the window (seconds) ROLLMESH_RESTART_MAX counts over; then it gives up.",
        ),
        EnvVar(
            "ROLLMESH_RESTARTS",
            0,
            "Set by `rollmesh up` on a child it restarts: its restarts so far (the child exports them as"
            " rollmesh_service_restarts_total{service}).",
        ),
        EnvVar(
            "ROLLMESH_STARTS_DIR",
            "",
            "A folder where each start of a service is counted (<service>.starts): without ROLLMESH_RESTARTS"
            " the starts before this one are its restarts (rollmesh_service_restarts_total; the compose"
            " stack sets it: a restarted container keeps the folder). Empty: not counted.",
        ),
        EnvVar(
            "ROLLMESH_EVENT_LOOP",
            "auto",
            "Servers' event loop: auto (uvloop when installed, but asyncio for the verifier and a "
            "ray-serve gateway), uvloop or asyncio.",
            parser=parse_event_loop,
        ),
        EnvVar("ROLLMESH_BIND_HOST", "127.0.0.1", "Host servers bind; 0.0.0.0 only when asked."),
        EnvVar("ROLLMESH_GRACE_SECONDS", 10.0, "Seconds to drain RPCs on SIGTERM."),
        EnvVar(
            "ROLLMESH_PORT_FILE",
            "",
            "When set, a server writes its bound host:port there once SERVING (for --port 0 launches), and"
            " its metrics endpoint's host:port to <that path>.metrics first when it serves one.",
        ),
        EnvVar(
            "ROLLMESH_METRICS_PORT",
            -1,
            "Port of the process's Prometheus /metrics endpoint, on the host its gRPC server binds (-1: off;"
            " 0: a free port). `rollmesh up --metrics` gives each service its own.",
            parser=parse_http_port,
        ),
        # Serving (Ray Serve + vLLM replicas); read by rollmesh.serving.config.ServingConfig.
        EnvVar(
            "ROLLMESH_RAY_ADDRESS",
            "",
            "Ray cluster to join (head:6379, auto on a node, or ray://head:10001); empty starts a local Ray.",
        ),
        EnvVar(
            "ROLLMESH_SERVE_APP_NAME",
            "",
            "Ray Serve application name (default: unique per gateway, rollmesh-<model>-<host>-<pid>-<id>).",
        ),
        EnvVar("ROLLMESH_REPLICAS", 1, "Data-parallel vLLM replicas (Ray Serve num_replicas)."),
        EnvVar(
            "ROLLMESH_REPLICAS_PER_NODE",
            0,
            "Most replicas on one Ray node (Serve max_replicas_per_node; 1 spreads one per node; 0: any).",
        ),
        EnvVar(
            "ROLLMESH_SERVE_ENGINE",
            "vllm",
            "Replica engine: vllm, or fake (scripted arithmetic answers, no weights; tests, demos).",
        ),
        EnvVar("ROLLMESH_FAKE_TOKEN_LATENCY_S", 0.0, "fake engine: seconds between generated tokens."),
        EnvVar(
            "ROLLMESH_FAKE_LATENCY_S",
            0.0,
            "gateway fake backend: seconds before each generation's first token (a slow model; benches).",
        ),
        EnvVar(
            "ROLLMESH_FAKE_SCRIPT",
            "",
            "gateway fake backend: what it answers, as module:function (a FakeBackend script); empty: "
            "it repeats the last user message.",
        ),
        EnvVar("ROLLMESH_REPLICA_CPUS", 1.0, "Ray CPUs reserved per replica."),
        EnvVar("ROLLMESH_REPLICA_GPUS", 0.0, "Ray GPUs per replica; > 0 serves on CUDA vLLM."),
        EnvVar("ROLLMESH_TP_SIZE", 1, "vLLM tensor-parallel size inside each replica."),
        EnvVar("ROLLMESH_VLLM_KVCACHE_GIB", 1, "CPU KV cache GiB per replica (VLLM_CPU_KVCACHE_SPACE)"),
        EnvVar("ROLLMESH_VLLM_GPU_MEMORY_UTILIZATION", 0.9, "vLLM gpu_memory_utilization on GPU."),
        EnvVar("ROLLMESH_VLLM_MAX_MODEL_LEN", 0, "vLLM max_model_len (0: the model's own)."),
        EnvVar("ROLLMESH_SERVE_STARTUP_TIMEOUT", 900.0, "Seconds to wait for every replica healthy."),
        # The environment verifier (read once into rollmesh.verifier.config.VerifierConfig).
        EnvVar("ROLLMESH_VERIFIER_SESSION_TTL_S", 600.0, "Verifier: idle seconds before a session expires."),
        EnvVar("ROLLMESH_VERIFIER_MAX_SESSIONS", 10000, "Verifier: open sessions allowed at once."),
        EnvVar(
            "ROLLMESH_VERIFIER_BATCH_CONCURRENCY",
            1024,
            "Verifier: items in flight per VerifyBatch stream (the scheduler sends a job's verifications "
            "over one).",
        ),
        EnvVar("ROLLMESH_VERIFIER_VERIFY_TIMEOUT_S", 60.0, "Verifier: seconds one Verify may take."),
        EnvVar("ROLLMESH_VERIFIER_WORKERS", 2, "Verifier: worker processes for CPU-bound checks."),
        EnvVar(
            "ROLLMESH_NEMO_GYM_PYTHON",
            "",
            "Verifier: the interpreter of a NeMo Gym installation, for managed NeMo Gym environments "
            "whose nemo_gym.toml names none (docs/nemo-gym-migration.md).",
        ),
        EnvVar(
            "ROLLMESH_VERIFIERS_PYTHON",
            "",
            "Verifier: the interpreter of a virtualenv with verifiers, for verifiers environments whose "
            "verifiers.toml names none (docs/verifiers.md).",
        ),
        EnvVar(
            "ROLLMESH_OPENENV_PYTHON",
            "",
            "Verifier: the interpreter of a virtualenv with openenv-core, for managed OpenEnv "
            "environments whose openenv.toml names none (docs/openenv.md).",
        ),
        EnvVar(
            "ROLLMESH_SIDECAR_CONFINE",
            True,
            "Verifier: run the servers it starts (managed NeMo Gym, verifiers) confined: as root a uid, "
            "read-only mounts and a pid namespace of their own (docs/security.md); 0: as its own user.",
        ),
        EnvVar(
            "ROLLMESH_SIDECAR_LOG_DIR",
            "",
            "Verifier: folder of the logs of the servers it starts (default: <tmp>/rollmesh-sidecars).",
        ),
        # Container tasks (verifier/bridges/container; docs/container-tasks.md).
        EnvVar(
            "ROLLMESH_CONTAINER_PROVIDER",
            "",
            "Verifier: the machine provider of every container-task environment, daemonless or docker "
            "(empty: each environment's container_tasks.toml).",
        ),
        EnvVar(
            "ROLLMESH_IMAGE_MAP",
            "",
            "Verifier: image renames for container tasks, FROM=TO[,FROM=TO...] "
            "(ubuntu:24.04=registry.local/ubuntu:24.04); wins over container_tasks.toml's [image_map].",
        ),
        EnvVar(
            "ROLLMESH_CONTAINER_WARM",
            0,
            "Verifier: container-task machines started ahead per task (0: container_tasks.toml's warm).",
        ),
        EnvVar(
            "ROLLMESH_CONTAINER_USERNS",
            True,
            "Verifier: each daemonless machine in a user namespace of its own (a leased block of host "
            "uids); 0: its root is the host's root, confined as Docker's.",
        ),
        EnvVar(
            "ROLLMESH_MACHINES_DIR",
            "/run/rollmesh/machines",
            "Verifier: where daemonless machines keep their labels and control sockets (swept at start).",
        ),
        EnvVar(
            "ROLLMESH_MACHINE_UID_LEASES",
            "/run/rollmesh/machine-uids",
            "Verifier: the lease files of the daemonless machines' uid blocks (host-wide).",
        ),
        EnvVar(
            "ROLLMESH_CACHE_DIR",
            "",
            "Where built things are cached (default ~/.cache/rollmesh): container tasks' bases and "
            "images, NeMo Gym and verifiers virtualenvs.",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_MATH_TIMEOUT_S",
            10.0,
            "Verifier: seconds per math-verify check (an overrun is tried once more, then scores 0).",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_MATH_JUDGE",
            False,
            "Verifier: ask an LLM judge (via the gateway) when math-verify says no.",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_MATH_JUDGE_MODEL",
            "",
            "Verifier: gateway model for the math judge (empty: default).",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_REASONING_GYM_READING",
            "final",
            "Verifier: how reasoning_gym reads the answer: final (the final assistant message, outside "
            "think blocks) or nemo_gym (NeMo Gym's server's reading, to re-score its rows as it did).",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_JUDGE_URL",
            "",
            "Verifier: the OpenAI-compatible base URL verifiers judges call (default: the gateway's "
            "OpenAI facade, ROLLMESH_GATEWAY_ADDR's host at ROLLMESH_OPENAI_HTTP_PORT; docs/verifiers.md).",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_JUDGE_MODEL",
            "",
            "Verifier: the model verifiers judges ask (empty: the gateway's default model).",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_SANDBOX_ISOLATION",
            "auto",
            "Verifier: code sandbox isolation: auto (namespaces; else process when ..._ALLOW_UNSAFE_PROCESS, "
            "else refuse to start), namespaces, or process (only with ..._ALLOW_UNSAFE_PROCESS).",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_SANDBOX_ALLOW_UNSAFE_PROCESS",
            False,
            "Verifier: UNSAFE opt-in: run untrusted code under Python-level guards only when "
            "namespaces are unavailable (logged, shown in ListEnvironments and `rollmesh status`).",
        ),
        EnvVar("ROLLMESH_VERIFIER_SANDBOX_CONCURRENCY", 4, "Verifier: code sandboxes running at once."),
        EnvVar("ROLLMESH_VERIFIER_SANDBOX_WALL_S", 10.0, "Verifier: wall-clock seconds per sandboxed run."),
        EnvVar(
            "ROLLMESH_VERIFIER_SANDBOX_MEMORY_MB",
            512,
            "Verifier: address space per sandboxed run (RLIMIT_AS).",
        ),
        EnvVar("ROLLMESH_VERIFIER_SANDBOX_CPU_S", 5, "Verifier: CPU seconds per sandboxed run (RLIMIT_CPU)."),
        EnvVar("ROLLMESH_VERIFIER_SANDBOX_NPROC", 32, "Verifier: processes per sandbox user (RLIMIT_NPROC)."),
        EnvVar(
            "ROLLMESH_VERIFIER_SANDBOX_FSIZE_MB",
            8,
            "Verifier: largest file a sandboxed run may write (RLIMIT_FSIZE); namespaces mode: all of them.",
        ),
        EnvVar(
            "ROLLMESH_VERIFIER_SANDBOX_OUTPUT_KB",
            64,
            "Verifier: stdout/stderr kept per sandboxed run (the rest is dropped).",
        ),
        *(
            EnvVar(
                f"ROLLMESH_{svc.upper()}_ADDR",
                f"127.0.0.1:{port}",
                f"Address of the {svc} service (host:port).",
                parser=parse_address,
            )
            for svc, port in DEFAULT_PORTS.items()
        ),
        # Gateway (rollmesh/gateway/config.py).
        EnvVar("ROLLMESH_GATEWAY_BACKEND", "ray-serve", "Gateway backend: ray-serve, openai or fake."),
        EnvVar(
            "ROLLMESH_GATEWAY_MODEL",
            "tiny-arith",
            "Served model: a path or registry model name (ray-serve), the remote model name (openai).",
        ),
        EnvVar("ROLLMESH_GATEWAY_MODEL_NAME", "", "Name clients use (default: the model's name)."),
        EnvVar("ROLLMESH_GATEWAY_BASE_URL", "", "OpenAI-compatible base URL for the openai backend."),
        EnvVar(
            "ROLLMESH_GATEWAY_API_KEY_ENV",
            "OPENAI_API_KEY",
            "Name of the variable holding the openai backend's API key (never the key itself).",
        ),
        EnvVar(
            "ROLLMESH_GATEWAY_UPSTREAM_CONNECTIONS",
            0,
            "openai backend: cap on upstream connections (0: one per request in flight, no cap).",
        ),
        EnvVar(
            "ROLLMESH_OPENAI_HTTP_PORT",
            OPENAI_HTTP_PORT,
            "Port of the gateway's OpenAI HTTP facade (-1: off).",
            parser=parse_http_port,
        ),
        EnvVar("ROLLMESH_GATEWAY_SESSION_TTL_S", 3600.0, "Seconds a gateway session is kept unused."),
        EnvVar(
            "ROLLMESH_WEIGHTS_STAGING_DIR",
            "",
            "Where UploadWeights stages streamed checkpoints (replicas load them from there: a shared "
            "mount on a multi-node cluster; default: <tmp>/rollmesh-weights).",
        ),
        EnvVar("ROLLMESH_GATEWAY_MAX_SESSIONS", 10_000, "Sessions kept (least recently used evicted)."),
        EnvVar("ROLLMESH_GATEWAY_DEFAULT_MAX_TOKENS", 256, "max_tokens when a request sets none."),
    ]
}


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of a registered variable, or its default when unset or empty."""
    var = ENV_VARS[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw == "":
        return var.default
    return var.parse(name, raw)


_VARIABLE = "rollmesh_variable"  # a setting field's metadata key: the variable it is read from


def setting(name: str) -> Any:
    """A config dataclass field read from the registered variable `name` (`replicas: int =
    setting("ROLLMESH_REPLICAS")`): its default is the registry's, so each default is written once,
    in ENV_VARS, and `read_fields` knows the field's variable from the field itself. (Any: the
    registry holds every type; tests/unit/test_config_settings.py checks each default's type against
    its field's.)"""
    return dataclasses.field(default=ENV_VARS[name].default, metadata={_VARIABLE: name})


def variable_of(f: dataclasses.Field[Any]) -> str | None:
    """The variable a `setting` field is read from (None: not a setting)."""
    name = f.metadata.get(_VARIABLE)
    return name if isinstance(name, str) else None


def read_fields(cls: type[D], environ: Mapping[str, str] | None = None, /, **given: Any) -> D:
    """A `cls` dataclass whose fields take `given[name]` (None there: not given, as a CLI flag left
    out), else, for a `setting` field, its variable's parsed value (its registered default when
    unset), else their own defaults."""
    values = {name: value for name, value in given.items() if value is not None}
    for f in dataclasses.fields(cls):
        var = variable_of(f)
        if var is not None and f.name not in values:
            values[f.name] = read(var, environ)
    return cls(**values)


def service_addr(service: str, environ: Mapping[str, str] | None = None) -> str:
    """`ROLLMESH_<SERVICE>_ADDR`, or the default loopback port from DESIGN.md."""
    return str(read(f"ROLLMESH_{service.upper()}_ADDR", environ))


@dataclass(frozen=True)
class ServerFlags:
    """A server's command-line overrides of its ROLLMESH_* variables (None: not given), passed from
    `rollmesh serve <service>` through the service's `__main__.main` to `ServerConfig.from_env`."""

    port: int | None = None
    host: str | None = None
    metrics_port: int | None = None


NO_FLAGS = ServerFlags()


@dataclass(frozen=True)
class ServerConfig:
    """What every server needs, read once."""

    host: str = setting("ROLLMESH_BIND_HOST")
    port: int = 0
    api_key: str = setting("ROLLMESH_API_KEY")
    grace_seconds: float = setting("ROLLMESH_GRACE_SECONDS")
    event_loop: str = setting("ROLLMESH_EVENT_LOOP")  # what `mesh.aio.run_server` runs the process on
    metrics_port: int = setting("ROLLMESH_METRICS_PORT")  # the Prometheus endpoint (-1: off)
    service: str = ""  # registry, verifier, gateway or scheduler (tracing's service.name)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def from_env(
        cls,
        service: str,
        flags: ServerFlags = NO_FLAGS,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> ServerConfig:
        addr_port = int(service_addr(service, environ).rpartition(":")[2])  # checked even if `port`
        return read_fields(
            cls,
            environ,
            host=flags.host or None,
            port=addr_port if flags.port is None else flags.port,
            metrics_port=flags.metrics_port,
            service=service,
        )
