"""What every rollmesh server shares: bootstrap, errors, auth, logging, configuration."""

from rollmesh.mesh.aio import TaskSet
from rollmesh.mesh.config import ConfigError, ServerConfig, parse_bool, service_addr
from rollmesh.mesh.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    RollmeshError,
    Unauthenticated,
    Unavailable,
)
from rollmesh.mesh.server import MeshServer, ServiceBinding, build_server, serve, wait_serving

__all__ = [
    "AlreadyExists",
    "ConfigError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "MeshServer",
    "NotFound",
    "ResourceExhausted",
    "RollmeshError",
    "ServerConfig",
    "ServiceBinding",
    "TaskSet",
    "Unauthenticated",
    "Unavailable",
    "build_server",
    "parse_bool",
    "serve",
    "service_addr",
    "wait_serving",
]
