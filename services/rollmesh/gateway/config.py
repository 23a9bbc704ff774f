"""Gateway configuration, read once: which models it serves (by name, each on a backend), the
default model, session limits and the OpenAI HTTP facade's port."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from rollmesh.mesh.config import NO_FLAGS
from rollmesh.mesh.config import ServerConfig
from rollmesh.mesh.config import ServerFlags
from rollmesh.mesh.config import read
from rollmesh.mesh.config import read_fields
from rollmesh.mesh.config import setting
from rollmesh.mesh.errors import ConfigError

BACKENDS = ("ray-serve", "openai", "fake")


@dataclass(frozen=True)
class ModelSpec:
    """One served model. `model` is a path or registry model name (ray-serve), the remote model name
    (openai) or just a label (fake). `replicas=None` leaves the backend's own default."""

    name: str
    backend: str = "ray-serve"
    model: str = ""
    replicas: int | None = None
    base_url: str = ""
    # Name of the environment variable holding the URL's API key (never the key itself).
    api_key_env: str = ""
    max_model_len: int = 0
    # openai backend: cap on upstream connections; 0 gives every request in flight its own, so the
    # caller's concurrency (not a library default pool) bounds the calls.
    max_connections: int = 0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.backend == "openai" and not self.base_url:
            raise ConfigError(
                f"model {self.name!r} uses the openai backend but has no base URL: "
                "pass --base-url or set ROLLMESH_GATEWAY_BASE_URL (e.g. http://127.0.0.1:8001/v1)"
            )
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"model {self.name!r}: base URL {self.base_url!r} is not http:// or https://")
        if self.replicas is not None and self.replicas < 1:
            raise ConfigError(f"model {self.name!r}: replicas={self.replicas} must be >= 1")
        if self.max_connections < 0:
            raise ConfigError("ROLLMESH_GATEWAY_UPSTREAM_CONNECTIONS must be >= 0 (0: no cap)")


def model_name_for(model: str) -> str:
    """The name clients use for `model`: a directory's name, or the name itself."""
    return Path(model).name if ("/" in model or "\\" in model) else model


def _backend_for(backend: str | None, base_url: str | None, environ: Mapping[str, str] | None) -> str:
    """The --backend flag, else ROLLMESH_GATEWAY_BACKEND, else openai when a base URL was given
    (--base-url or ROLLMESH_GATEWAY_BASE_URL: `serve gateway --base-url URL` started Ray Serve and
    never called URL), else ray-serve. A --base-url flag with another --backend flag is refused:
    one of them would be ignored."""
    if base_url and backend and backend != "openai":
        raise ConfigError(f"--base-url is the openai backend's URL: --backend {backend} does not use it")
    if backend:
        return backend
    env = os.environ if environ is None else environ
    if (base_url or env.get("ROLLMESH_GATEWAY_BASE_URL")) and not env.get("ROLLMESH_GATEWAY_BACKEND"):
        return "openai"
    return str(read("ROLLMESH_GATEWAY_BACKEND", environ))


@dataclass(frozen=True)
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    models: tuple[ModelSpec, ...] = ()
    default_model: str = ""
    http_host: str = "127.0.0.1"
    # Port of the OpenAI-compatible HTTP facade; 0 picks a free one, -1 turns it off.
    http_port: int = setting("ROLLMESH_OPENAI_HTTP_PORT")
    session_ttl_s: float = setting("ROLLMESH_GATEWAY_SESSION_TTL_S")
    max_sessions: int = setting("ROLLMESH_GATEWAY_MAX_SESSIONS")
    default_max_tokens: int = setting("ROLLMESH_GATEWAY_DEFAULT_MAX_TOKENS")
    max_routes: int = 1024
    # UploadWeights; empty: <tmp>/rollmesh-weights
    weights_staging_dir: str = setting("ROLLMESH_WEIGHTS_STAGING_DIR")

    def __post_init__(self) -> None:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ConfigError(f"model names must be unique, got {names}")
        if self.models and self.default_model not in names:
            raise ConfigError(f"default model {self.default_model!r} is not one of {names}")
        if self.session_ttl_s <= 0 or self.max_sessions < 1:
            raise ConfigError(
                "ROLLMESH_GATEWAY_SESSION_TTL_S must be > 0 and ROLLMESH_GATEWAY_MAX_SESSIONS >= 1"
            )
        if self.default_max_tokens < 1:
            raise ConfigError("ROLLMESH_GATEWAY_DEFAULT_MAX_TOKENS must be >= 1")

    @classmethod
    def from_env(
        cls,
        flags: ServerFlags = NO_FLAGS,
        *,
        http_port: int | None = None,
        backend: str | None = None,
        model: str | None = None,
        model_name: str | None = None,
        replicas: int | None = None,
        base_url: str | None = None,
        api_key_env: str | None = None,
        server: ServerConfig | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> GatewayConfig:
        """Flags (`flags`, the server's; the others: None, not given) over ROLLMESH_* variables over
        defaults; `server` given
        (the embedded mesh's gateway, which binds no address of its own) skips reading one."""
        server = server or ServerConfig.from_env("gateway", flags, environ=environ)
        model_ref = model or str(read("ROLLMESH_GATEWAY_MODEL", environ))
        name = model_name or str(read("ROLLMESH_GATEWAY_MODEL_NAME", environ)) or model_name_for(model_ref)
        spec = ModelSpec(
            name=name,
            backend=_backend_for(backend, base_url, environ),
            model=model_ref,
            replicas=replicas,
            base_url=base_url or str(read("ROLLMESH_GATEWAY_BASE_URL", environ)),
            api_key_env=api_key_env or str(read("ROLLMESH_GATEWAY_API_KEY_ENV", environ)),
            max_connections=int(read("ROLLMESH_GATEWAY_UPSTREAM_CONNECTIONS", environ)),
        )
        return read_fields(
            cls,
            environ,
            server=server,
            models=(spec,),
            default_model=spec.name,
            http_host=server.host,
            http_port=http_port,
        )
