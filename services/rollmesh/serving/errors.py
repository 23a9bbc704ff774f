"""Serving errors. `ServingStartupError` and `EngineRejected` are reported to callers (status code +
ErrorInfo reason); `RequestRejected` crosses the Ray handle from a replica to `RayServeBackend`,
which reports it as `EngineRejected`."""

from __future__ import annotations

from rollmesh.mesh.errors import InvalidArgument, Unavailable


class ServingStartupError(Unavailable):
    """The replicas did not all become healthy before the deadline, or their deployment failed."""

    reason = "SERVING_STARTUP_FAILED"


class EngineRejected(InvalidArgument):
    """vLLM refused the request as given (e.g. prompt + max_tokens over max_model_len)."""

    reason = "ENGINE_REJECTED_REQUEST"


class RequestRejected(ValueError):
    """vLLM refused the request as given (bad sampling values, prompt + max_tokens too long)."""
