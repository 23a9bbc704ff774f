"""Domain errors and their mapping to `google.rpc.Status` with one `ErrorInfo`.

Domain code raises a `RollmeshError` subclass; the server interceptor (mesh/interceptors.py)
turns it into a rich status. Anything else becomes INTERNAL: the traceback goes to the log, the
client gets a short message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from google.rpc import status_pb2

DOMAIN = "rollmesh.dev"


class RollmeshError(Exception):
    """Base of every error a service reports to its callers. A subclass given `code=` (the classes
    below, one per status code) reports that code, with the code's name as its reason."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"

    def __init_subclass__(cls, code: grpc.StatusCode | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code, cls.reason = code, code.name

    def __init__(
        self,
        message: str,
        *,
        metadata: Mapping[str, str] | None = None,
        retry_after_s: float | None = None,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after_s = retry_after_s
        if reason is not None:
            self.reason = reason


class InvalidArgument(RollmeshError, code=grpc.StatusCode.INVALID_ARGUMENT): ...


class NotFound(RollmeshError, code=grpc.StatusCode.NOT_FOUND): ...


class AlreadyExists(RollmeshError, code=grpc.StatusCode.ALREADY_EXISTS): ...


class FailedPrecondition(RollmeshError, code=grpc.StatusCode.FAILED_PRECONDITION): ...


class ResourceExhausted(RollmeshError, code=grpc.StatusCode.RESOURCE_EXHAUSTED): ...


class Unavailable(RollmeshError, code=grpc.StatusCode.UNAVAILABLE): ...


class DeadlineExceeded(RollmeshError, code=grpc.StatusCode.DEADLINE_EXCEEDED): ...


class Unauthenticated(RollmeshError, code=grpc.StatusCode.UNAUTHENTICATED): ...


class Internal(RollmeshError, code=grpc.StatusCode.INTERNAL): ...


def to_status(exc: RollmeshError) -> status_pb2.Status:
    """The `google.rpc.Status` for a domain error: its code, message, one ErrorInfo, maybe RetryInfo."""
    info = error_details_pb2.ErrorInfo(reason=exc.reason, domain=DOMAIN, metadata=exc.metadata)
    status = status_pb2.Status(code=exc.code.value[0], message=exc.message)
    status.details.add().Pack(info)
    if exc.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(exc.retry_after_s * 1e9))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    return status


# google.rpc code -> HTTP status (the mapping in google/rpc/code.proto).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(exc: RollmeshError) -> int:
    """The HTTP status an HTTP door (the OpenAI facade, the OpenEnv server) answers for `exc` (a
    class may override its code's default with `http_status_override`)."""
    override = getattr(exc, "http_status_override", None)
    if isinstance(override, int):
        return override
    return HTTP_STATUS.get(exc.code, 500)


class ConfigError(ValueError):
    """A configuration value is malformed; the message names the variable and what is allowed."""


class NotJson(ValueError):
    """The text is not JSON this process can read; the message says why."""
