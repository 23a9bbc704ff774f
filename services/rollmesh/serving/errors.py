"""Serving errors. `ServingStartupError`, `EngineRejected`, `ServeAppExists` and the `Ray*` join
errors (join.py) are reported to callers (status code + ErrorInfo reason), each in one line;
`RequestRejected` crosses the Ray handle from a replica to `RayServeBackend`, which reports it as
`EngineRejected`. `StaleReplica` and `WeightsDrift` stay inside serving (weights_record.py)."""

from __future__ import annotations

from rollmesh.mesh import errors as mesh


class ServingStartupError(mesh.Unavailable):
    """The replicas did not all become healthy before the deadline, or their deployment failed."""

    reason = "SERVING_STARTUP_FAILED"


class EngineRejected(mesh.InvalidArgument):
    """vLLM refused the request as given (e.g. prompt + max_tokens over max_model_len)."""

    reason = "ENGINE_REJECTED_REQUEST"


class RequestRejected(ValueError):
    """vLLM refused the request as given (bad sampling values, prompt + max_tokens too long)."""


class ServeAppExists(mesh.AlreadyExists):
    """A Serve application with this gateway's name already runs on the joined cluster."""

    reason = "SERVE_APP_EXISTS"


class RayUnreachable(mesh.Unavailable):
    reason = "RAY_CLUSTER_UNREACHABLE"


class RayAuthFailed(mesh.Unauthenticated):
    reason = "RAY_AUTH_FAILED"


class RayVersionMismatch(mesh.FailedPrecondition):
    reason = "RAY_VERSION_MISMATCH"


class RayNotANode(mesh.FailedPrecondition):
    reason = "RAY_NOT_A_NODE"


class StaleReplica(RuntimeError):
    """A replica answered from weights other than the application's current ones (weights_record.py);
    `RayServeBackend` runs the request on another replica instead of passing the answer on."""


class WeightsDrift(RuntimeError):
    """A replica serves weights the application's record does not allow (its health check raises
    this, so Serve replaces it)."""


class BatchItemFailed(Exception):
    """The replica failed one item of a batch with an error that is not a rejection."""
