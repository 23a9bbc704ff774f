"""The rollmesh client SDK: typed async clients for every service of the mesh."""

from rollmesh_client._base import unary_call
from rollmesh_client._channel import ConnectConfig
from rollmesh_client._channel import aio_channel
from rollmesh_client._channel import max_message_bytes
from rollmesh_client._client import Client
from rollmesh_client._client import default_address
from rollmesh_client._errors import AlreadyExistsError
from rollmesh_client._errors import CancelledError
from rollmesh_client._errors import DeadlineExceededError
from rollmesh_client._errors import FailedPreconditionError
from rollmesh_client._errors import InternalError
from rollmesh_client._errors import InvalidArgumentError
from rollmesh_client._errors import NotFoundError
from rollmesh_client._errors import ResourceExhaustedError
from rollmesh_client._errors import RollmeshClientError
from rollmesh_client._errors import UnauthenticatedError
from rollmesh_client._errors import UnavailableError
from rollmesh_client._errors import from_grpc_error
from rollmesh_client._errors import from_status
from rollmesh_client._gateway import GatewayClient
from rollmesh_client._gateway import generate_mux
from rollmesh_client._registry import RegistryClient
from rollmesh_client._scheduler import JobHandle
from rollmesh_client._scheduler import SchedulerClient
from rollmesh_client._streams import BATCH_METADATA
from rollmesh_client._streams import Multiplexed
from rollmesh_client._streams import batch_messages
from rollmesh_client._streams import call_many
from rollmesh_client._streams import items_of
from rollmesh_client._streams import max_item_bytes
from rollmesh_client._streams import says_batches
from rollmesh_client._sync import SyncClient
from rollmesh_client._verifier import VerifierClient
from rollmesh_client._verifier import verify_mux

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
