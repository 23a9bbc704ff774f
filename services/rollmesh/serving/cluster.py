"""Start or join Ray, deploy the replicas as one Serve application, wait until every one is healthy.

With no address, a local Ray starts inside this process with small footprints (no dashboard, a
small object store, logical CPUs = what the replicas need or the machine's count) and its workers at
normal priority (Ray's default nice 15 starves the replicas next to this process); this process owns
it and shuts Serve and Ray down when its last `ServingCluster` stops. With an address
(`ROLLMESH_RAY_ADDRESS`: `head:6379`, `auto` on a node of a running cluster, or `ray://head:10001`)
it joins a cluster someone else runs (join.py: token auth, one-line errors) and the replicas go
wherever the cluster has room: that is how serving scales past one machine.

On a joined cluster rollmesh owns exactly one thing, its Serve application (`config.app_name`,
unique per gateway by default) with its weights record (weights_record.py): `shutdown` deletes
both and disconnects this driver; it never stops Serve or Ray, which other applications there may
use. Deploying refuses a name that already exists on a joined cluster rather than replace someone
else's replicas, and writes a fresh weights record (the config's model_path) before it deploys.

Every Ray and Serve call here is blocking, so each runs in a worker thread, never on the loop.
`ray.init`/`ray.shutdown` run on one thread that lives as long as the process (`ProcessLifetimeThread`):
Ray ties its local GCS and raylet to the thread that started them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

from rollmesh.mesh.aio import ProcessLifetimeThread
from rollmesh.mesh.logging import get_logger
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.deployment import build_app
from rollmesh.serving.deployment import engine_kwargs
from rollmesh.serving.errors import ServeAppExists
from rollmesh.serving.errors import ServingStartupError
from rollmesh.serving.join import connect_error
from rollmesh.serving.join import driver_on_node
from rollmesh.serving.join import enable_token_auth
from rollmesh.serving.join import wait_reachable
from rollmesh.serving.weights_record import WeightsRecord
from rollmesh.serving.weights_record import delete_record
from rollmesh.serving.weights_record import write_record

log = get_logger(__name__)

_REPLICA_PREFIX = "SERVE_REPLICA::"
_SERVE_NAMESPACE = "serve"
_POLL_S = 1.0
_REACH_TIMEOUT_S = 20.0
# Ray's lifecycle calls, for every ServingCluster of the process (one Ray per process).
_RAY_THREAD = ProcessLifetimeThread("rollmesh-ray")


@dataclass
class _ProcessRay:
    """This process's one Ray connection: how many ServingClusters use it, and whether this
    process started that Ray (then it stops Serve and Ray with the last user)."""

    users: int = 0
    owned: bool = False


_PROCESS_RAY = _ProcessRay()


@dataclass(frozen=True)
class DeploymentState:
    app_status: str
    deployment_status: str
    running: int
    message: str

    def describe(self) -> str:
        return (
            f"app={self.app_status} deployment={self.deployment_status} running_replicas={self.running}"
            + (f"; last message: {self.message}" if self.message else "")
        )


class ServingCluster:
    """Owns (or joins) the Ray cluster and owns the Serve application for one `ServingConfig`."""

    def __init__(self, config: ServingConfig) -> None:
        self.config = config
        self._uses_ray = False  # counted in _PROCESS_RAY.users

    @property
    def joined(self) -> bool:
        """True when this process joined a Ray cluster it did not start."""
        return bool(self.config.ray_address) and not _PROCESS_RAY.owned

    async def start(self) -> Any:
        """Start or join Ray, deploy, wait until every replica is healthy; the replicas' handle."""
        t0 = time.monotonic()
        await _RAY_THREAD.run(self._init_ray)
        t1 = time.monotonic()
        handle = await self._deploy()
        seconds = {"ray": round(t1 - t0, 1), "replicas": round(time.monotonic() - t1, 1)}
        log.info("serving_started", app=self.config.app_name, joined=self.joined, **seconds)
        return handle

    def _init_ray(self) -> None:
        import ray
        from ray import serve

        cfg = self.config
        if not ray.is_initialized():
            if cfg.ray_address:
                _connect(cfg.ray_address)
            else:
                num_cpus = max(float(os.cpu_count() or 1), cfg.replicas * cfg.replica_cpus)
                kwargs: dict[str, Any] = {
                    "num_cpus": int(num_cpus + 0.999),  # what the replicas need, or the machine's count
                    "include_dashboard": False,
                    "object_store_memory": cfg.object_store_mb * 1024 * 1024,
                    "log_to_driver": False,
                    # Ray runs its workers at nice 15 by default: the replicas (and the vLLM engine
                    # processes they spawn) then lose every contended core to this process's
                    # scheduler and gateway, so the engine sees tiny batches. They are the work here.
                    "_system_config": {"worker_niceness": 0},
                }
                if cfg.replica_gpus > 0:
                    kwargs["num_gpus"] = int(cfg.replicas * cfg.replica_gpus + 0.999)
                # The replicas (which inherit this environment) run their methods on the actor's own
                # event loop rather than on a second thread: each request and each streamed object
                # then crosses no thread (measured: replica + engine CPU 5.2 -> 4.5 ms per request
                # at 16 in flight). Ray Serve's own throughput-optimized mode does the same.
                os.environ.setdefault("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD", "0")
                _start_local_ray(kwargs)
                _PROCESS_RAY.owned = True
        _PROCESS_RAY.users += 1
        self._uses_ray = True
        serve.start(proxy_location="Disabled")

    def _refuse_taken_name(self) -> None:
        from ray import serve

        name = self.config.app_name
        if name in serve.status().applications:
            raise ServeAppExists(
                f"a Serve application named {name!r} already runs on the Ray cluster at "
                f"{self.config.ray_address} (another gateway's?): set ROLLMESH_SERVE_APP_NAME to another "
                "name, or unset it for a unique one; a gateway killed without shutdown leaves its "
                f"application behind (remove it with ray.serve.delete({name!r}))"
            )

    async def _deploy(self) -> Any:
        from ray import serve

        cfg = self.config
        if self.joined:
            await asyncio.to_thread(self._refuse_taken_name)
        log.info("serving_deploying", **asdict(cfg) | {"device": cfg.device, "engine": engine_kwargs(cfg)})
        # Replicas load the record's weights at start: a fresh application serves its model_path.
        await asyncio.to_thread(write_record, cfg.app_name, WeightsRecord.initial(cfg.model_path))
        app = build_app(cfg)
        run = asyncio.create_task(
            asyncio.to_thread(serve.run, app, name=cfg.app_name, route_prefix=None, blocking=False)
        )
        try:
            await self.wait_healthy(run=run)
            return await run
        except BaseException:
            if not run.done():
                await asyncio.to_thread(serve.delete, cfg.app_name)
            await asyncio.gather(run, return_exceptions=True)
            raise

    async def state(self) -> DeploymentState:
        from ray import serve

        status = await asyncio.to_thread(serve.status)
        app = status.applications.get(self.config.app_name)
        if app is None:
            return DeploymentState("NOT_STARTED", "", 0, "")
        dep = app.deployments.get(self.config.deployment_name)
        running = 0
        dep_status, message = "", app.message
        if dep is not None:
            running = sum(
                n for s, n in dep.replica_states.items() if str(getattr(s, "value", s)) == "RUNNING"
            )
            dep_status = str(getattr(dep.status, "value", dep.status))
            message = dep.message or app.message
        return DeploymentState(str(getattr(app.status, "value", app.status)), dep_status, running, message)

    async def wait_healthy(
        self, *, timeout_s: float | None = None, run: asyncio.Task[Any] | None = None
    ) -> None:
        """Poll until the app is RUNNING with every replica RUNNING (each passed its health check)."""
        timeout = self.config.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        last = DeploymentState("NOT_STARTED", "", 0, "")
        while True:
            if run is not None and run.done() and run.exception() is not None:
                raise ServingStartupError(
                    f"deploying {self.config.app_name!r} failed: {run.exception()}; {last.describe()}"
                )
            last = await self.state()
            if last.app_status == "DEPLOY_FAILED" or last.deployment_status == "DEPLOY_FAILED":
                raise ServingStartupError(f"deploying {self.config.app_name!r} failed: {last.describe()}")
            if last.app_status == "RUNNING" and last.running >= self.config.replicas:
                return
            if time.monotonic() > deadline:
                raise ServingStartupError(
                    f"{self.config.replicas} replicas of {self.config.app_name!r} not healthy after "
                    f"{timeout:.0f}s: {last.describe()}"
                )
            await asyncio.sleep(_POLL_S)

    async def replica_ids(self) -> list[str]:
        """Unique ids of the live replica actors of this deployment (starting ones included)."""
        import ray

        marker = f"{_REPLICA_PREFIX}{self.config.app_name}#{self.config.deployment_name}#"
        actors = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        return sorted(
            a["name"][len(marker) :]
            for a in actors
            if a.get("namespace") == _SERVE_NAMESPACE and a["name"].startswith(marker)
        )

    def replica_actor_name(self, replica_id: str) -> str:
        return f"{_REPLICA_PREFIX}{self.config.app_name}#{self.config.deployment_name}#{replica_id}"

    async def shutdown(self) -> None:
        """Delete this config's Serve application. Serve and Ray stop only when this process started
        them and this was their last user; on a joined cluster the last user only disconnects."""
        import ray
        from ray import serve

        if not self._uses_ray:
            return
        self._uses_ray = False
        try:
            if ray.is_initialized():
                await asyncio.to_thread(serve.delete, self.config.app_name)
                await asyncio.to_thread(delete_record, self.config.app_name)
        finally:
            _PROCESS_RAY.users -= 1
            if _PROCESS_RAY.users == 0 and ray.is_initialized():
                if _PROCESS_RAY.owned:
                    await _RAY_THREAD.run(_shutdown_serve)
                await _RAY_THREAD.run(ray.shutdown)  # a joined cluster: disconnects this driver only
            if _PROCESS_RAY.users == 0:
                _PROCESS_RAY.owned = False
        log.info("serving_stopped", app=self.config.app_name, joined=bool(self.config.ray_address))


def _shutdown_serve() -> None:
    """`serve.shutdown()`, first forgetting cached deployment handles whose router ran on an event
    loop that is closed by now (a handle routes on its creator's loop; an earlier backend of this
    process may have gone with its loop): shutting such a handle down raises 'Event loop is closed'
    and would leave Serve running."""
    from ray import serve
    from ray.serve import context

    client = context._global_client
    cache: dict[Any, Any] = getattr(client, "handle_cache", None) or {}
    for key, handle in list(cache.items()):
        loop = getattr(getattr(handle, "_router", None), "_asyncio_loop", None)
        if loop is not None and loop.is_closed():
            del cache[key]
    serve.shutdown()  # type: ignore[no-untyped-call]


def _connect(address: str) -> None:
    """Join the cluster at `address` (token auth when a token is found); one-line errors."""
    import ray

    wait_reachable(address, timeout_s=_REACH_TIMEOUT_S)
    token = enable_token_auth()
    kwargs: dict[str, Any] = {}
    if driver_on_node(address):
        # The driver attaches to the Ray node of this host (as Ray registers a node by default: the
        # IP of the default route), not to whichever raylet `ps` shows first.
        kwargs["_node_ip_address"] = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    log.info("ray_joining", address=address, auth_token=token or "none found", **kwargs)
    try:
        ray.init(address=address, log_to_driver=False, **kwargs)
    except Exception as exc:
        error = connect_error(address, exc)
        log.warning("ray_join_failed", address=address, reason=error.reason, error=repr(exc)[:2000])
        raise error from exc


LOCAL_RAY_ATTEMPTS = 3


def _start_local_ray(kwargs: dict[str, Any]) -> None:
    """Start a local Ray. Ray waits a fixed 30 s for its raylet to register, which a loaded machine
    can miss; such a start is retried (each attempt a fresh node), then reported in one line.
    A failed attempt's processes are stopped: Ray forgets a node whose start failed and leaves its
    GCS, monitors and dashboard running, which loads the machine further for the next attempt."""
    import ray

    for attempt in range(1, LOCAL_RAY_ATTEMPTS + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:  # Ray raises a bare Exception for a node that timed out
            with contextlib.suppress(Exception):
                ray.shutdown()
            stopped = _stop_own_ray_processes()
            if attempt == LOCAL_RAY_ATTEMPTS:
                raise ServingStartupError(
                    f"could not start a local Ray node ({LOCAL_RAY_ATTEMPTS} attempts): {exc}"
                ) from exc
            # One line per failed attempt (it is the user's terminal under `rollmesh run`).
            log.warning("ray_start_retry", attempt=attempt, stopped_processes=stopped, error=str(exc)[:300])


def _stop_own_ray_processes() -> int:
    """Kill this process's descendants that run Ray's own programs (only called while this process
    has no Ray node: they belong to a failed start). Returns how many were killed."""
    import psutil  # type: ignore[import-untyped]
    import ray

    ray_dir = os.path.dirname(ray.__file__)
    killed = 0
    for child in psutil.Process().children(recursive=True):
        try:
            if any(ray_dir in part for part in child.cmdline()):
                child.kill()
                killed += 1
        except psutil.Error:
            continue
    return killed
