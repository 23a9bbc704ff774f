"""Gateway errors, each with its status code and ErrorInfo reason.

The gRPC interceptor maps them to `google.rpc.Status`; the OpenAI HTTP facade maps the same classes
to an HTTP status and an OpenAI-style JSON error (`http_status`, `openai_type`), so both doors
report one error the same way.
"""

from __future__ import annotations

import grpc

from rollmesh.mesh import errors as mesh
from rollmesh.mesh.errors import HTTP_STATUS
from rollmesh.mesh.errors import http_status

__all__ = ["HTTP_STATUS", "http_status"]  # the mesh's table, which the facade answers with

OPENAI_TYPE: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_request_error",
    grpc.StatusCode.FAILED_PRECONDITION: "invalid_request_error",
    grpc.StatusCode.UNAUTHENTICATED: "authentication_error",
    grpc.StatusCode.NOT_FOUND: "not_found_error",
    grpc.StatusCode.ALREADY_EXISTS: "conflict_error",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "rate_limit_error",
    grpc.StatusCode.UNAVAILABLE: "service_unavailable_error",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout_error",
}


def openai_type(exc: mesh.RollmeshError) -> str:
    return OPENAI_TYPE.get(exc.code, "server_error")


class ModelNotFound(mesh.NotFound):
    reason = "MODEL_NOT_FOUND"


class InvalidSampling(mesh.InvalidArgument):
    """A sampling parameter is out of range; `metadata["field"]` names it."""

    reason = "INVALID_SAMPLING_PARAMS"


class InvalidGenerateRequest(mesh.InvalidArgument):
    """The request shape is wrong (no prompt, both prompt forms, bad tool schema ...)."""

    reason = "INVALID_GENERATE_REQUEST"


def bad_request(message: str, field: str) -> InvalidGenerateRequest:
    """INVALID_GENERATE_REQUEST naming the request field at fault (`metadata["field"]`)."""
    return InvalidGenerateRequest(message, metadata={"field": field})


class PromptTooLong(mesh.ResourceExhausted):
    """The prompt does not fit the model's context. No RetryInfo: retrying cannot help. Over HTTP
    this is 400 (OpenAI's `context_length_exceeded`), so OpenAI clients do not retry it like a 429."""

    reason = "PROMPT_TOO_LONG"
    http_status_override = 400


class TokenIdsUnsupported(mesh.FailedPrecondition):
    reason = "TOKEN_IDS_UNSUPPORTED"


class BackendDown(mesh.Unavailable):
    """The backend cannot serve now; carries RetryInfo (`retry_after_s`)."""

    reason = "BACKEND_UNAVAILABLE"


class GenerationDeadlineExceeded(mesh.DeadlineExceeded):
    reason = "GENERATION_DEADLINE_EXCEEDED"


class PausedDeadlineExceeded(mesh.DeadlineExceeded):
    """The deadline passed while generation was paused (around a weight update)."""

    reason = "GENERATION_PAUSED"


class DuplicateRequestId(mesh.AlreadyExists):
    reason = "REQUEST_ID_IN_USE"


class RouteExists(mesh.AlreadyExists):
    reason = "ROUTE_EXISTS"


class InvalidRoute(mesh.InvalidArgument):
    reason = "INVALID_ROUTE"


class TooManyRoutes(mesh.ResourceExhausted):
    reason = "TOO_MANY_ROUTES"


class BackendUnavailable(Exception):
    """Raised by a backend that cannot serve now (down, restarting); the gateway answers UNAVAILABLE
    (`BackendDown`) with RetryInfo. Backends that know the cause raise an `Upstream*` error instead."""

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# -- an OpenAI-compatible upstream failed: one reason per cause (failure classes key on these names) --


class UpstreamHttpError(mesh.Unavailable):
    """The upstream answered HTTP 5xx (`metadata["http_status"]`); retryable, with RetryInfo."""

    reason = "UPSTREAM_HTTP_ERROR"


class UpstreamRejected(mesh.InvalidArgument):
    """The upstream refused the request (HTTP 4xx, `metadata["http_status"]`); its message is passed on."""

    reason = "UPSTREAM_REJECTED"


class UpstreamRateLimited(mesh.ResourceExhausted):
    """The upstream answered 429; RetryInfo carries its Retry-After (1 s when it gave none)."""

    reason = "UPSTREAM_RATE_LIMITED"


class UpstreamAuthFailed(mesh.FailedPrecondition):
    """The upstream refused our API key (HTTP 401/403): a configuration problem, not retryable."""

    reason = "UPSTREAM_AUTH_FAILED"


class UpstreamTimeout(mesh.DeadlineExceeded):
    """The upstream sent nothing for the backend's read timeout (or answered 408); retryable."""

    reason = "UPSTREAM_TIMEOUT"


class UpstreamStreamDropped(mesh.Unavailable):
    """The upstream closed the connection before the answer was complete; retryable."""

    reason = "UPSTREAM_STREAM_DROPPED"


class UpstreamUnreachable(mesh.Unavailable):
    """No connection to the upstream (refused, DNS, connect timeout); retryable."""

    reason = "UPSTREAM_UNREACHABLE"


class BodyTooLarge(mesh.ResourceExhausted):
    """An HTTP request body over the mesh's message limit (ROLLMESH_MAX_MESSAGE_MB, what gRPC refuses
    too): refused as it arrives, never held whole. 413, no RetryInfo."""

    reason = "MESSAGE_TOO_LARGE"
    http_status_override = 413


class UpstreamBadResponse(mesh.Internal):
    """The upstream answered 200 with something that is not a chat completion (not JSON, no
    choices, no message): never read as an empty answer, which would score as a wrong one. Not
    retryable (it is how that server answers); the HTTP facade reports it as 502."""

    reason = "UPSTREAM_BAD_RESPONSE"
    http_status_override = 502


class UpstreamContentFiltered(UpstreamBadResponse):
    """The upstream cut its answer (finish_reason `content_filter`): what it sent is half an answer,
    which a verifier must never score. Not retryable (the same prompt is filtered again)."""

    reason = "UPSTREAM_CONTENT_FILTERED"


class CheckpointIncompatible(mesh.InvalidArgument):
    """The checkpoint cannot replace the served weights; `metadata["problem"]` says why."""

    reason = "CHECKPOINT_INCOMPATIBLE"


class WeightUpdatesUnsupported(mesh.FailedPrecondition):
    reason = "WEIGHT_UPDATES_UNSUPPORTED"


class WeightLoadFailed(mesh.RollmeshError):
    """A replica failed to load a validated checkpoint; the update was rolled back (the previous
    weights keep serving). `metadata["replica_errors"]` lists replica: reason."""

    code, reason = grpc.StatusCode.ABORTED, "WEIGHT_LOAD_FAILED"


class DrainTimeout(mesh.DeadlineExceeded):
    """Running generations did not finish within the drain timeout; nothing was changed."""

    reason = "WEIGHT_UPDATE_DRAIN_TIMEOUT"


class UploadInvalid(mesh.InvalidArgument):
    """An UploadWeights stream broke its rules (file name, order, sha256); nothing was kept."""

    reason = "UPLOAD_INVALID"


class UploadTooLarge(mesh.ResourceExhausted):
    """An UploadWeights stream passed the served checkpoint's size plus a margin; nothing was kept."""

    reason = "UPLOAD_TOO_LARGE"


class HttpCallError(Exception):
    """A call that got no complete HTTP answer."""


class ConnectFailed(HttpCallError):
    pass


class ConnectTimedOut(HttpCallError):
    pass


class ReadTimedOut(HttpCallError):
    pass


class ConnectionBroke(HttpCallError):
    pass


class AnswerTooLarge(HttpCallError):
    pass


# -- captures (an external agent program's per-rollout URL: captures.py) --


class CaptureExists(mesh.AlreadyExists):
    reason = "CAPTURE_EXISTS"


class CaptureNotFound(mesh.NotFound):
    """No open capture by that id (never opened, or closed: its rollout is over)."""

    reason = "CAPTURE_NOT_FOUND"


class CaptureTokenWrong(mesh.Unauthenticated):
    reason = "CAPTURE_TOKEN_WRONG"


class CaptureCallsExhausted(mesh.ResourceExhausted):
    """The capture answered its `max_calls`; no RetryInfo: a later call is refused as well."""

    reason = "CAPTURE_CALLS_EXHAUSTED"


class CaptureUnavailable(mesh.FailedPrecondition):
    """The gateway serves no HTTP facade, so a capture has no URL."""

    reason = "CAPTURE_NO_HTTP"
