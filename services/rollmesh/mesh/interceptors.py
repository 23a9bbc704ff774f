"""The one server interceptor every service runs: bearer auth, error mapping, one log line per RPC
(at debug for calls that end OK, at info otherwise), the RPC's Prometheus metrics (started by
method, ended by method and status code, with its latency: mesh/metrics.py), a server span for each
unary call when tracing is on (child of the caller's, from the W3C context in the metadata:
mesh/tracing.py), and INVALID_ARGUMENT (reason UNDECODABLE_REQUEST) for a request, or a streamed
request message, that does not decode.

Domain errors (`RollmeshError`) become `google.rpc.Status` with an ErrorInfo; any other exception
becomes INTERNAL with a short message while the traceback goes to the log. Health and reflection
are exempt from auth so `grpcurl list` and health probes work without a token; the token check
itself is the SDK's (`rollmesh_client._auth`), shared with the trainer's sink server.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator
from collections.abc import Callable
from typing import Any

import grpc
import structlog
from google.rpc import code_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from rollmesh.mesh import errors
from rollmesh.mesh import tracing
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.metrics import RpcRecorder
from rollmesh.mesh.metrics import rpc_type
from rollmesh_client._auth import BearerAuthInterceptor
from rollmesh_client._auth import rebuild

log = get_logger("rollmesh.rpc")
_stdlib_log = logging.getLogger("rollmesh.rpc")  # cached level checks

Behavior = Callable[..., Any]


def status_of(exc: BaseException) -> status_pb2.Status:
    """The status a call that raised `exc` ends with: a domain error's own; INTERNAL with a short
    message for anything else (its traceback goes to the log)."""
    if isinstance(exc, errors.RollmeshError):
        return errors.to_status(exc)
    log.error("rpc_internal_error", exc_info=exc)
    return errors.to_status(errors.Internal("internal error; see the server log"))


def _finish(
    method: str, code: str, context: grpc.aio.ServicerContext[Any, Any], start: float, recorder: RpcRecorder
) -> None:
    """One `rpc` line per call: at info when it did not end OK (always logged), at debug when it did;
    and the call in the metrics.

    Successful calls are the hot path (a scheduler makes ~5 per rollout, thousands a second); each
    service logs its own canonical line per unit of work (e.g. the scheduler's per rollout/job).
    """
    if code == "OK" and context.cancelled():
        code = "CANCELLED"
    recorder.record(code, time.perf_counter() - start)
    if tracing.in_sampled_trace():  # inside the call's server span
        tracing.annotate(**{"rpc.grpc.status_code": tracing.grpc_status_code(code)})
    if code == "OK":
        if _stdlib_log.isEnabledFor(logging.DEBUG):
            log.debug("rpc", method=method, code=code, duration_ms=_ms_since(start))
        return
    log.info("rpc", method=method, code=code, duration_ms=_ms_since(start))


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)


class _Undecodable:
    """What the lenient deserializer hands over for bytes that are not the method's message."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """`deserialize`, but a failure becomes an `_Undecodable` the wrapped handler turns into
    INVALID_ARGUMENT (raised inside grpc.aio it would be UNKNOWN plus an error-level traceback)."""
    if deserialize is None:
        return None

    def lenient(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:
            return _Undecodable(exc)

    return lenient


def _check(request: Any) -> Any:
    if isinstance(request, _Undecodable):
        raise errors.InvalidArgument(
            f"the request is not a valid protobuf message for this method ({request.error})",
            reason="UNDECODABLE_REQUEST",
        )
    return request


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _check(request)


def _decoded(request: Any, request_streaming: bool) -> Any:
    """The request (or request iterator) the servicer gets: undecodable input raises InvalidArgument."""
    return _checked(request) if request_streaming else _check(request)


@contextlib.asynccontextmanager
async def _observed(
    method: str, context: grpc.aio.ServicerContext[Any, Any], recorder: RpcRecorder
) -> AsyncIterator[None]:
    """Around one call: logging context, errors mapped to a status (`status_of`), the `rpc` line and
    the metrics."""
    code, start = "OK", time.perf_counter()
    recorder.started()
    with structlog.contextvars.bound_contextvars(rpc=method):
        try:
            yield
        except grpc.aio.AbortError:
            code = _aborted_code(context)
            raise
        except Exception as exc:
            status = status_of(exc)
            code = code_pb2.Code.Name(status.code)
            await context.abort_with_status(rpc_status.to_status(status))
        finally:
            _finish(method, code, context, start, recorder)


def _aborted_code(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The code a handler's own `context.abort(...)` set (ABORTED_BY_HANDLER if it cannot be read)."""
    try:
        code = context.code()
    except (AttributeError, NotImplementedError):  # (a context without code(): older grpc, a fake)
        return "ABORTED_BY_HANDLER"
    return code.name if isinstance(code, grpc.StatusCode) else "ABORTED_BY_HANDLER"


def _wrap_unary(method: str, behavior: Behavior, request_streaming: bool, recorder: RpcRecorder) -> Behavior:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        # A server span, child of the caller's, when the call carries a sampled trace's context
        # (callers outside sampled traces send none: nothing to do here).
        if (
            not request_streaming
            and tracing.enabled()
            and tracing.sampled(parent := tracing.metadata_carrier(context.invocation_metadata()))
        ):
            service, _, name = method.lstrip("/").rpartition("/")
            with tracing.span(method.lstrip("/"), tracing.rpc(service, name), parent=parent, kind="server"):
                async with _observed(method, context, recorder):
                    return await behavior(_decoded(request, request_streaming), context)
        async with _observed(method, context, recorder):
            return await behavior(_decoded(request, request_streaming), context)

    return wrapped


def _wrap_stream(method: str, behavior: Behavior, request_streaming: bool, recorder: RpcRecorder) -> Behavior:
    if not inspect.isasyncgenfunction(behavior):
        return _wrap_unary(method, behavior, request_streaming, recorder)

    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        async with _observed(method, context, recorder):
            # aclosing: when the client cancels, grpc.aio closes *this* generator (GeneratorExit
            # at the yield); the handler's own generator must close now too, so its `finally`
            # (abort the engine request, release a session) runs at once, not at GC.
            items = behavior(_decoded(request, request_streaming), context)
            async with contextlib.aclosing(items):
                async for item in items:
                    yield item

    return wrapped


class MeshInterceptor(BearerAuthInterceptor):
    """Auth (when an API key is set), decoding, error mapping, per-RPC logging and metrics for every
    method."""

    def __init__(self, api_key: str) -> None:
        super().__init__(api_key)
        self._recorders: dict[tuple[str, str], RpcRecorder] = {}  # one per method served: bounded

    def _recorder(self, method: str, kind: str) -> RpcRecorder:
        recorder = self._recorders.get((method, kind))
        if recorder is None:
            recorder = self._recorders[(method, kind)] = RpcRecorder(method, kind)
        return recorder

    def admit(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        request_streaming = bool(handler.request_streaming)
        recorder = self._recorder(method, rpc_type(request_streaming, bool(handler.response_streaming)))

        def wrap(behavior: Behavior, response_streaming: bool) -> Behavior:
            wrapper = _wrap_stream if response_streaming else _wrap_unary
            return wrapper(method, behavior, request_streaming, recorder)

        return rebuild(handler, wrap, request_deserializer=_lenient(handler.request_deserializer))

    def on_deny(self, method: str) -> None:
        log.warning("rpc_unauthenticated", method=method)
