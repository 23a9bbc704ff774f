"""The rollmesh client SDK: typed async clients for every service of the mesh."""

from rollmesh_client._channel import ConnectConfig, aio_channel
from rollmesh_client._client import Client, default_address
from rollmesh_client._errors import (
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    RollmeshClientError,
    UnauthenticatedError,
    UnavailableError,
    from_grpc_error,
)
from rollmesh_client._registry import RegistryClient

__all__ = [
    "AlreadyExistsError",
    "CancelledError",
    "Client",
    "ConnectConfig",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "RegistryClient",
    "ResourceExhaustedError",
    "RollmeshClientError",
    "UnauthenticatedError",
    "UnavailableError",
    "aio_channel",
    "default_address",
    "from_grpc_error",
]
