"""Client-side errors: one class per gRPC status code, with the ErrorInfo reason and metadata.

`from_grpc_error` turns an `AioRpcError` (or sync `RpcError`) into the matching class, unpacking
the `google.rpc.Status` details the servers attach; `from_status` does the same for a Status carried
inside a message (the per-item errors of VerifyBatch).
"""

from __future__ import annotations

from typing import Any
from typing import ClassVar

import grpc
from google.rpc import error_details_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status


class RollmeshClientError(Exception):
    """An RPC to a rollmesh service failed. `.code`, `.reason`, `.metadata`, `.retry_after_s`."""

    grpc_code: ClassVar[grpc.StatusCode | None] = None
    _by_code: ClassVar[dict[grpc.StatusCode, type[RollmeshClientError]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.grpc_code is not None:
            RollmeshClientError._by_code[cls.grpc_code] = cls

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata = metadata or {}
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}" + (f" [{self.reason}]" if self.reason else "")

    @property
    def retryable(self) -> bool:
        """UNAVAILABLE always; RESOURCE_EXHAUSTED only when the server sent RetryInfo."""
        return self.code == grpc.StatusCode.UNAVAILABLE or (
            self.code == grpc.StatusCode.RESOURCE_EXHAUSTED and self.retry_after_s is not None
        )


class InvalidArgumentError(RollmeshClientError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(RollmeshClientError):
    grpc_code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(RollmeshClientError):
    grpc_code = grpc.StatusCode.ALREADY_EXISTS


class FailedPreconditionError(RollmeshClientError):
    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(RollmeshClientError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(RollmeshClientError):
    grpc_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(RollmeshClientError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnauthenticatedError(RollmeshClientError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class CancelledError(RollmeshClientError):
    grpc_code = grpc.StatusCode.CANCELLED


class InternalError(RollmeshClientError):
    grpc_code = grpc.StatusCode.INTERNAL


def from_grpc_error(exc: grpc.RpcError) -> RollmeshClientError:
    """The typed error for a failed RPC, with ErrorInfo reason/metadata and RetryInfo when present."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = (exc.details() if hasattr(exc, "details") else "") or str(code)
    try:
        status = rpc_status.from_call(exc) if isinstance(exc, grpc.Call) else None
    except ValueError:
        status = None
    if status is None and isinstance(exc, grpc.aio.AioRpcError):
        status = _status_from_aio(exc)
    return _typed(code, message, status)


def from_status(status: status_pb2.Status) -> RollmeshClientError:
    """The typed error for a `google.rpc.Status` carried in a message (a per-item error of a stream)."""
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    return _typed(code, status.message or str(code), status)


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _typed(code: grpc.StatusCode, message: str, status: status_pb2.Status | None) -> RollmeshClientError:
    reason, metadata, retry = "", {}, None
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            ri = error_details_pb2.RetryInfo()
            detail.Unpack(ri)
            retry = ri.retry_delay.ToNanoseconds() / 1e9
    cls = RollmeshClientError._by_code.get(code, RollmeshClientError)
    return cls(message, code=code, reason=reason, metadata=metadata, retry_after_s=retry)


def _status_from_aio(exc: grpc.aio.AioRpcError) -> status_pb2.Status | None:
    for key, value in exc.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            return status_pb2.Status.FromString(value)
    return None
