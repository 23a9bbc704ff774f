"""OpenTelemetry tracing, once for every service: set-up from the standard OTEL_* variables, spans,
and W3C trace context carried between services.

Off unless configured: `configure(service)` turns it on only when an OTLP endpoint is set
(`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER=otlp`,
and never with `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. Off, nothing of the SDK is
imported and every helper here is a check of one flag (`span` yields None, `inject` gives {}).
On, the SDK reads its own variables: the exporter's endpoint, headers and timeout, the sampler
(`OTEL_TRACES_SAMPLER=parentbased_traceidratio`, `OTEL_TRACES_SAMPLER_ARG=0.01`: one rollout in a
hundred traced, and every span of a traced one), `OTEL_SERVICE_NAME` (default `rollmesh-<service>`);
`OTEL_EXPORTER_OTLP_PROTOCOL` picks grpc (default) or http/protobuf. Spans leave in batches from a
thread (the SDK's BatchSpanProcessor): nothing waits on the collector.

Context travels as W3C `traceparent`/`tracestate`: in gRPC metadata for unary calls (the caller
passes `metadata()` with the call, the server interceptor extracts it), and in the `trace_context`
field of each multiplexed item (GenerateRequest, VerifyRequest), since one stream carries many calls.

What a rollout left out by the sampler costs with tracing on: one random number compared with the
sampler's bound (`new_trace`), then a context-variable read at each would-be span, and nothing on
the wire (no `traceparent`, so the services downstream do no trace work either). No gRPC
interceptor runs on the client side: a Python interceptor on a grpc.aio channel costs every call
an extra task, traced or not.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import random
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeVar

from rollmesh.mesh.logging import get_logger

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.trace import Tracer

log = get_logger("rollmesh.tracing")
T = TypeVar("T")


class _State:
    tracer: Tracer | None = None
    provider: Any = None
    propagator: Any = None
    roots: Any = None  # the OTEL_TRACES_SAMPLER sampler: whether a new trace is recorded
    # New traces whose random 64 bits fall under this are sampled (the roots' own rule when they are
    # a trace-id ratio, always on or always off); None: ask `roots` each time.
    bound: int | None = None


_state = _State()
# Inside a span of a sampled trace (set by `span` and `within`): what every child span, `start` and
# `inject` check first, so work outside sampled traces costs a context-variable read.
_SAMPLED: contextvars.ContextVar[bool] = contextvars.ContextVar("rollmesh_trace_sampled", default=False)


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Do the OTEL_* variables ask for traces?"""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(endpoint) or exporter == "otlp"


def enabled() -> bool:
    return _state.tracer is not None


def configure(service: str, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process when the OTEL_* variables ask for it (once: later calls keep
    the first set-up); returns whether it is on."""
    if _state.tracer is not None or not wanted(environ):
        return _state.tracer is not None
    env = os.environ if environ is None else environ
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace import sampling
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    if protocol.strip().lower().startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        exporter: Any = HttpExporter()
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter = GrpcExporter()
    name = env.get("OTEL_SERVICE_NAME") or f"rollmesh-{service}"
    # The variables' sampler decides each new trace here (`span(root=True)`), before any span exists:
    # a trace left out costs one decision. The provider records what it is given: the roots let in
    # and the children of sampled traces.
    roots = sampling._get_from_env_or_default()
    provider = TracerProvider(
        sampler=sampling.ParentBased(sampling.ALWAYS_ON),
        resource=Resource.create({"service.name": name}),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _state.provider, _state.propagator, _state.roots = provider, TraceContextTextMapPropagator(), roots
    _state.bound = _bound_of(roots)
    _state.tracer = provider.get_tracer("rollmesh")
    log.info("tracing_on", service_name=name, protocol=protocol, sampler=str(roots.get_description()))
    return True


def shutdown() -> None:
    """Send what is buffered and turn tracing off (a server's stop; tests)."""
    provider = _state.provider
    _state.tracer = _state.provider = _state.propagator = _state.roots = _state.bound = None
    if provider is not None:
        provider.shutdown()


def sampled(carrier: Mapping[str, str]) -> bool:
    """Does the W3C context in `carrier` belong to a sampled trace?"""
    parts = carrier.get("traceparent", "").split("-")
    return (
        len(parts) == 4
        and len(parts[3]) == 2
        and all(c in "0123456789abcdef" for c in parts[3])
        and (int(parts[3], 16) & 1 == 1)
    )


def in_sampled_trace() -> bool:
    """Is the current work inside a sampled trace (False when tracing is off)?"""
    return _SAMPLED.get()


_ALL = 1 << 64  # a bound every 64-bit number is under


def _bound_of(roots: Any) -> int | None:
    """The bound a new trace's random 64 bits are compared with, for the samplers OTEL_TRACES_SAMPLER
    names (a new trace has no parent, so a ParentBased sampler's root sampler decides): the ratio
    sampler's own bound (it compares a trace id's low 64 bits with it), every or no trace for the
    static ones; None for any other sampler (asked each time)."""
    from opentelemetry.sdk.trace import sampling

    root = roots._root if isinstance(roots, sampling.ParentBased) else roots
    if isinstance(root, sampling.TraceIdRatioBased):
        return int(root.bound)
    if isinstance(root, sampling.StaticSampler):
        decision = root.should_sample(None, 0, "rollout").decision
        return _ALL if decision == sampling.Decision.RECORD_AND_SAMPLE else 0
    return None


def new_trace(name: str = "rollout") -> bool:
    """Does the sampler let a new trace in (False when tracing is off)? Decided before any span or
    attribute exists: a trace left out costs this call."""
    if _state.tracer is None:
        return False
    bound = _state.bound
    if bound is not None:
        return random.getrandbits(64) < bound
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace.sampling import Decision

    result = _state.roots.should_sample(Context(), random.getrandbits(128), name)
    return bool(result.decision == Decision.RECORD_AND_SAMPLE)


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    parent: Mapping[str, str] | None = None,
    kind: str = "internal",
    root: bool = False,
) -> Iterator[Span | None]:
    """A span named `name`, current inside the block: with `root`, the first of a new trace (the
    sampler decides whether it is recorded: OTEL_TRACES_SAMPLER, `new_trace`; a caller that asked
    `new_trace` itself, before building attributes, uses `trace`); else a child of the W3C context in
    `parent` (a carrier from another service) or of the current span, made only when that trace is
    sampled, so a rollout left out by the sampler costs nothing more. None when no span was made.
    An exception leaving the block is recorded on the span and sets its status to error."""
    tracer = _state.tracer
    if tracer is None:
        yield None
        return
    if root:
        wanted = new_trace(name)
    else:
        wanted = sampled(parent) if parent else _SAMPLED.get()
    if not wanted:
        yield None
        return
    with _recorded(tracer, name, attributes, parent, kind, root) as s:
        yield s


@contextlib.contextmanager
def trace(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span | None]:
    """The root span of a new trace the sampler already let in (`new_trace()` was True), current
    inside the block (None when tracing is off)."""
    tracer = _state.tracer
    if tracer is None:
        yield None
        return
    with _recorded(tracer, name, attributes, None, "internal", True) as s:
        yield s


@contextlib.contextmanager
def _recorded(
    tracer: Tracer,
    name: str,
    attributes: Mapping[str, Any] | None,
    parent: Mapping[str, str] | None,
    kind: str,
    root: bool,
) -> Iterator[Span]:
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    context = Context() if root else _state.propagator.extract(parent) if parent else None
    token = _SAMPLED.set(True)
    try:
        with tracer.start_as_current_span(
            name, context=context, kind=getattr(SpanKind, kind.upper()), attributes=dict(attributes or {})
        ) as s:
            yield s
    finally:
        _SAMPLED.reset(token)


def inject() -> dict[str, str]:
    """The current span's W3C context as a carrier ({} when tracing is off or no sampled span is
    current: the callee then makes no span either)."""
    if _state.propagator is None or not _SAMPLED.get():
        return {}
    carrier: dict[str, str] = {}
    _state.propagator.inject(carrier)
    return carrier


def metadata() -> tuple[tuple[str, str], ...] | None:
    """The current span's W3C context as a unary call's metadata (`stub.Method(req, metadata=...)`);
    None when tracing is off or no sampled span is current."""
    if _state.propagator is None or not _SAMPLED.get():
        return None
    return tuple(inject().items()) or None


def metadata_carrier(metadata: Any) -> dict[str, str]:
    """The W3C keys of gRPC invocation metadata."""
    return {k: v for k, v in (metadata or ()) if k in ("traceparent", "tracestate") and isinstance(v, str)}


def within(
    name: str,
    carrier: Mapping[str, str],
    work: Callable[[], Awaitable[T]],
    attributes: Mapping[str, Any] | None = None,
    finished: Callable[[T], Mapping[str, Any]] | None = None,
) -> Callable[[], Awaitable[T]]:
    """`work` run inside a server span `name` whose parent is the W3C context in `carrier` (a
    multiplexed item's `trace_context`), with `finished(result)`'s attributes set when it returns;
    `work` itself when tracing is off or that trace is not sampled."""
    if _state.tracer is None or not sampled(carrier):
        return work

    async def traced() -> T:
        with span(name, attributes, parent=dict(carrier), kind="server") as s:
            result = await work()
            if s is not None and finished is not None:
                s.set_attributes(dict(finished(result)))
            return result

    return traced


def rpc(service: str, method: str) -> dict[str, str]:
    """The OpenTelemetry RPC semantic-convention attributes of a gRPC call to `service`
    (`rollmesh.v1.ModelGateway`) and `method` (a Generate or Verify sent over a multiplexed stream
    is named as the call it is: `Generate`, `Verify`)."""
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


def gen_ai_request(
    model: str,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The OpenTelemetry GenAI semantic-convention attributes of a chat request (what is known: an
    empty model, the gateway's default, and unset sampling fields are left out)."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.system": "rollmesh"}
    for key, value in (
        ("gen_ai.request.model", model or None),
        ("gen_ai.request.temperature", temperature),
        ("gen_ai.request.top_p", top_p),
        ("gen_ai.request.max_tokens", max_tokens),
    ):
        if value is not None:
            attributes[key] = value
    return attributes


def gen_ai_response(
    *, input_tokens: int, output_tokens: int, finish_reason: str, model: str = ""
) -> dict[str, Any]:
    """The GenAI semantic-convention attributes of a chat answer."""
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
        "gen_ai.response.finish_reasons": (finish_reason,) if finish_reason else (),
    }
    if model:
        attributes["gen_ai.response.model"] = model
    return attributes


def grpc_status_code(code: str) -> int:
    """`rpc.grpc.status_code`: the number of the status code named `code` (2, UNKNOWN, for a name
    that is not one)."""
    import grpc

    status = getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN)
    return int(status.value[0])


def set_error(description: str) -> None:
    """Set the current span's status to ERROR: a failure that did not leave the span as an exception
    (a rollout that failed after every retry). Nothing when tracing is off or the trace is not
    sampled."""
    if _state.tracer is None or not _SAMPLED.get():
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status
    from opentelemetry.trace import StatusCode

    trace.get_current_span().set_status(Status(StatusCode.ERROR, description[:200]))


def start(name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = "client") -> Span | None:
    """A span child of the current one that is not made current (for code that yields, where a
    current span could not be reset in the right context): the caller ends it (`end`). None when
    tracing is off or the current trace is not sampled."""
    tracer = _state.tracer
    if tracer is None or not _SAMPLED.get():
        return None
    from opentelemetry.trace import SpanKind

    return tracer.start_span(name, kind=getattr(SpanKind, kind.upper()), attributes=dict(attributes or {}))


def carrier_for(s: Span | None) -> dict[str, str]:
    """The W3C context whose parent is `s` (a span from `start`), for work in another process
    (a Ray Serve replica); {} for None."""
    if s is None or _state.propagator is None:
        return {}
    from opentelemetry import trace

    carrier: dict[str, str] = {}
    _state.propagator.inject(carrier, context=trace.set_span_in_context(s))
    return carrier


def start_from(
    name: str,
    carrier: Mapping[str, str],
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: str = "server",
) -> Span | None:
    """A span whose parent is the W3C context in `carrier` (another process's span), not made
    current (for a generator): the caller ends it (`end`). None when tracing is off here or that
    trace is not sampled."""
    tracer = _state.tracer
    if tracer is None or not sampled(carrier):
        return None
    from opentelemetry.trace import SpanKind

    context = _state.propagator.extract(dict(carrier))
    return tracer.start_span(
        name, context=context, kind=getattr(SpanKind, kind.upper()), attributes=dict(attributes or {})
    )


def end(
    s: Span | None, attributes: Mapping[str, Any] | None = None, error: BaseException | None = None
) -> None:
    """End a span from `start` (None: nothing), with `attributes` and the error it ended on."""
    if s is None:
        return
    if attributes:
        s.set_attributes(dict(attributes))
    if error is not None:
        from opentelemetry.trace import Status
        from opentelemetry.trace import StatusCode

        s.record_exception(error)
        s.set_status(Status(StatusCode.ERROR, str(error)[:200]))
    s.end()


def annotate(**attributes: Any) -> None:
    """Set attributes on the current span (nothing when tracing is off or the trace is not sampled)."""
    if _state.tracer is None or not _SAMPLED.get():
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(attributes)
