"""The rollmesh client SDK: typed async clients for every service of the mesh."""

from rollmesh_client._base import unary_call
from rollmesh_client._channel import ConnectConfig, aio_channel, max_message_bytes
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
    from_status,
)
from rollmesh_client._gateway import GatewayClient, generate_mux
from rollmesh_client._registry import RegistryClient
from rollmesh_client._scheduler import JobHandle, SchedulerClient
from rollmesh_client._streams import (
    BATCH_METADATA,
    Multiplexed,
    batch_messages,
    call_many,
    items_of,
    max_item_bytes,
    says_batches,
)
from rollmesh_client._sync import SyncClient
from rollmesh_client._verifier import VerifierClient, verify_mux

__all__ = [
    "BATCH_METADATA",
    "AlreadyExistsError",
    "CancelledError",
    "Client",
    "ConnectConfig",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "GatewayClient",
    "InternalError",
    "InvalidArgumentError",
    "JobHandle",
    "Multiplexed",
    "NotFoundError",
    "RegistryClient",
    "ResourceExhaustedError",
    "RollmeshClientError",
    "SchedulerClient",
    "SyncClient",
    "UnauthenticatedError",
    "UnavailableError",
    "VerifierClient",
    "aio_channel",
    "batch_messages",
    "call_many",
    "default_address",
    "from_grpc_error",
    "from_status",
    "generate_mux",
    "items_of",
    "max_item_bytes",
    "max_message_bytes",
    "says_batches",
    "unary_call",
    "verify_mux",
]
