"""Prometheus metrics, once for every service: the `/metrics` HTTP endpoint, the per-RPC metrics the
server interceptor records, the per-item metrics of multiplexed streams, and `LiveCollector` for what
a service reads off its own state at scrape time.

Every metric lives in prometheus_client's process-wide default registry (so the embedded mesh, all
services in one process, serves them all from one endpoint, next to the client's process_* and
python_* metrics). A service defines its own metrics at module level, named `rollmesh_<service>_...`
with the unit in the name (`_seconds`, `_tokens_total`), and labels from bounded sets only (a method,
a status code, an environment, a model, an outcome): never a job id, rollout key or session id.

Recording costs a dict lookup and a lock per sample, whether or not the endpoint is on; the endpoint
itself is off unless asked for (ROLLMESH_METRICS_PORT, `rollmesh serve ... --metrics-port`, `rollmesh up
--metrics`). It serves from a thread, on the host the gRPC server binds.
"""

from __future__ import annotations

import fcntl
import inspect
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Generic
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY
from prometheus_client import CollectorRegistry
from prometheus_client import Counter
from prometheus_client import Histogram
from prometheus_client import disable_created_metrics
from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from rollmesh.mesh import config
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.logging import get_logger

log = get_logger("rollmesh.metrics")

# No `<counter>_created` series: they double the series count and no dashboard here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# Seconds: from a health check or an in-process verify (100 us) to a long generation or a sandboxed run
# (minutes). The sub-millisecond bounds keep a fast call's p95 from reading as the lowest bound.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
)

# The names of grpc-ecosystem's go-grpc-prometheus, which ready-made dashboards read.
RPC_HANDLED = Counter(
    "grpc_server_handled",
    "RPCs completed on the server, by method and status code.",
    ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
)
RPC_STARTED = Counter(
    "grpc_server_started",
    "RPCs started on the server, by method (a stream counts at its start: started minus handled is"
    " the RPCs open now).",
    ["grpc_type", "grpc_service", "grpc_method"],
)
RPC_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Time from an RPC's start to its end on the server (a stream: its whole life).",
    ["grpc_type", "grpc_service", "grpc_method"],
    buckets=LATENCY_BUCKETS,
)
SERVICE_RESTARTS = Counter(
    "rollmesh_service_restarts",
    "Times this service was restarted: by `rollmesh up` after it died (ROLLMESH_RESTARTS, set on the"
    " child it restarts), else its starts after the first counted in ROLLMESH_STARTS_DIR (a container"
    " compose restarts); counts on from the dead process's value.",
    ["service"],
)
ITEMS = Counter(
    "rollmesh_stream_items",
    "Items served over a multiplexed stream (GenerateMany, VerifyBatch) or in-process, by outcome code.",
    ["item", "code"],
)
ITEM_SECONDS = Histogram(
    "rollmesh_stream_item_seconds",
    "Time one multiplexed item took, from its start to its outcome.",
    ["item"],
    buckets=LATENCY_BUCKETS,
)


def rpc_type(request_streaming: bool, response_streaming: bool) -> str:
    """go-grpc-prometheus's grpc_type label."""
    if request_streaming:
        return "bidi_stream" if response_streaming else "client_stream"
    return "server_stream" if response_streaming else "unary"


class RpcRecorder:
    """The metrics of one method (`/pkg.Service/Method`): the label children made once, so a call
    costs one counter and one histogram update."""

    __slots__ = ("_handled", "_labels", "_seconds", "_started")

    def __init__(self, method: str, kind: str) -> None:
        service, _, name = method.lstrip("/").rpartition("/")
        self._labels = (kind, service, name)
        self._seconds = RPC_SECONDS.labels(*self._labels)
        self._handled: dict[str, Any] = {"OK": RPC_HANDLED.labels(*self._labels, "OK")}
        self._started = RPC_STARTED.labels(*self._labels)

    def started(self) -> None:
        self._started.inc()

    def record(self, code: str, seconds: float) -> None:
        counter = self._handled.get(code)
        if counter is None:
            counter = self._handled[code] = RPC_HANDLED.labels(*self._labels, code)
        counter.inc()
        self._seconds.observe(seconds)


def count_restarts(service: str, environ: Mapping[str, str] | None = None) -> int:
    """This process's restarts so far (`restarts_so_far`) into `rollmesh_service_restarts_total
    {service}`, so the series goes 0, 1, 2 ... across the service's processes. Blocking (it may
    count this start in a file): call it off the loop."""
    restarts = restarts_so_far(service, environ)
    SERVICE_RESTARTS.labels(service).inc(restarts)
    return restarts


def restarts_so_far(service: str, environ: Mapping[str, str] | None = None) -> int:
    """The restarts this process of `service` follows: those `rollmesh up` handed it
    (ROLLMESH_RESTARTS); else, with ROLLMESH_STARTS_DIR set, the starts of `service` counted in that
    folder before this one (this start counted too: a container that compose restarts keeps the
    folder, deploy/docker-compose.yml); else 0."""
    env = os.environ if environ is None else environ
    if "ROLLMESH_RESTARTS" in env:
        return int(config.read("ROLLMESH_RESTARTS", env))
    folder = str(config.read("ROLLMESH_STARTS_DIR", env))
    return count_start(Path(folder) / f"{service}.starts") if folder else 0


def count_start(path: Path) -> int:
    """Add one start to the count in `path` (made when missing), under a lock; the starts before
    it. A file that cannot be written, or holds no count, is a ConfigError naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"ROLLMESH_STARTS_DIR: cannot count starts in {path} ({exc.strerror or exc})"
        ) from None
    with os.fdopen(fd, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        text = f.read().strip()
        if text and not text.isdigit():
            raise ConfigError(f"ROLLMESH_STARTS_DIR: {path} holds {text[:40]!r}, not a count of starts")
        before = int(text or 0)
        f.seek(0)
        f.truncate()
        f.write(f"{before + 1}\n")
    return before


def record_item(item: str, code: str, start: float) -> None:
    """One multiplexed item of kind `item` ended with `code` (a google.rpc code name); `start` is its
    time.perf_counter() at start."""
    ITEMS.labels(item, code).inc()
    ITEM_SECONDS.labels(item).observe(time.perf_counter() - start)


S = TypeVar("S")
Sample = tuple[str, dict[str, str], float]
"""A family's name (a counter's without `_total`), a sample's labels and its value."""


class LiveCollector(Collector, Generic[S]):
    """Gauges (and counters: the families named in `counters`) read at scrape time off live objects
    (jobs by state, the concurrency in use, a bridged server's restarts): one collector per metric
    family set, registered once. A counter family is named without `_total` (its sample has it) and
    must only grow while its object lives. A service registers a callback, a bound
    method that returns a snapshot of its state (`LIVE.watch(self.live_jobs)`); `samples(snapshot)`,
    the telemetry module's, turns it into gauges. So a service's telemetry never imports the service
    it reads. The service is held weakly: one made in a test and dropped stops being read. The
    callback runs on the endpoint's thread: it may only read attributes (never await, never
    mutate)."""

    def __init__(
        self,
        samples: Callable[[S], Iterable[Sample]],
        docs: dict[str, str],
        *,
        newest: frozenset[str] = frozenset(),
        counters: frozenset[str] = frozenset(),
        registry: CollectorRegistry = REGISTRY,
    ):
        if unknown := (newest | counters) - docs.keys():
            raise ValueError(f"LiveCollector: no doc for {sorted(unknown)}")
        self._samples = samples
        self._docs = docs
        self._counters = counters
        self._newest = newest  # families that are not amounts (a version): the largest, not the sum
        # The service -> its callback's function (unbound: a bound method would keep it alive).
        self._sources: weakref.WeakKeyDictionary[object, Callable[[object], S]] = weakref.WeakKeyDictionary()
        registry.register(self)

    def watch(self, snapshot: Callable[[], S]) -> None:
        """Read `snapshot()` at every scrape while its object lives; `snapshot` is a bound method."""
        if not inspect.ismethod(snapshot):
            raise TypeError(f"LiveCollector.watch takes a bound method (held weakly), not {snapshot!r}")
        self._sources[snapshot.__self__] = snapshot.__func__

    def _combine(self, name: str, seen: float | None, value: float) -> float:
        """Several objects with the same labels (a process that made more than one): the sum of
        amounts; for a `newest` family the largest number, a NaN only when no object has one."""
        if seen is None:
            return value
        if name not in self._newest:
            return seen + value
        return value if math.isnan(seen) else seen if math.isnan(value) else max(seen, value)

    def _family(self, name: str, labels: list[str] | None = None) -> GaugeMetricFamily | CounterMetricFamily:
        kind = CounterMetricFamily if name in self._counters else GaugeMetricFamily
        return kind(name, self._docs[name], labels=labels)

    def describe(self) -> list[Metric]:
        return [self._family(name) for name in self._docs]

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for obj, snapshot in list(self._sources.items()):
            for name, labelled, value in self._samples(snapshot(obj)):
                key = (name, tuple(sorted(labelled.items())))
                values[key] = self._combine(name, values.get(key), value)
        for (name, labels), value in values.items():
            family = families.get(name)
            if family is None:
                family = families[name] = self._family(name, [k for k, _ in labels])
            family.add_metric([v for _, v in labels], value)
        yield from families.values()


@dataclass
class MetricsEndpoint:
    """A running `/metrics` HTTP server; `stop()` shuts it down."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_endpoint(host: str, port: int) -> MetricsEndpoint:
    """Serve the registry at http://host:port/metrics (port 0: a free one) from a daemon thread; a port
    that cannot be bound is a ConfigError naming it."""
    try:
        server, thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise ConfigError(
            f"could not bind the metrics endpoint {host}:{port} ({exc.strerror or exc}): is the port in use?"
        ) from None
    bound = int(server.server_port)
    log.info("metrics_endpoint_started", url=f"http://{host}:{bound}/metrics")
    return MetricsEndpoint(host, bound, server, thread)


def metrics_file(port_file: str) -> str:
    """Where a server started with ROLLMESH_PORT_FILE=`port_file` writes its metrics endpoint's
    host:port (before the port file itself, so a parent that saw the port file can read it)."""
    return f"{port_file}.metrics"
