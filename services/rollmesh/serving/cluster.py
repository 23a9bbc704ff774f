"""Start or join Ray, deploy the vLLM application on Ray Serve, wait until every replica is healthy.

With no address, a local Ray starts inside this process with small footprints (no dashboard, a
small object store, logical CPUs = what the replicas need or the machine's count). With an address
(`ROLLMESH_RAY_ADDRESS`, e.g. `auto` on a node of a running cluster or `ray://head:10001`), the
replicas go wherever the cluster has room: that is how serving scales past one machine.

Every Ray and Serve call here is blocking, so each runs in a worker thread, never on the loop.
`ray.init`/`ray.shutdown` run on one thread that lives as long as the process (`ProcessLifetimeThread`):
Ray ties its local GCS and raylet to the thread that started them.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from rollmesh.mesh.aio import ProcessLifetimeThread
from rollmesh.mesh.logging import get_logger
from rollmesh.serving.config import ServingConfig
from rollmesh.serving.deployment import build_app, config_summary
from rollmesh.serving.errors import ServingStartupError

log = get_logger(__name__)

_REPLICA_PREFIX = "SERVE_REPLICA::"
_SERVE_NAMESPACE = "serve"
_POLL_S = 1.0
# Ray's lifecycle calls, for every ServingCluster of the process (one Ray per process).
_RAY_THREAD = ProcessLifetimeThread("rollmesh-ray")


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
    """Owns (or joins) the Ray cluster and the Serve application for one `ServingConfig`."""

    def __init__(self, config: ServingConfig) -> None:
        self.config = config
        self._owns_ray = False
        self._handle: Any = None
        self.startup_seconds: dict[str, float] = {}

    @property
    def handle(self) -> Any:
        """The `DeploymentHandle` of the replicas (after `start`)."""
        if self._handle is None:
            raise RuntimeError("ServingCluster.start() has not completed")
        return self._handle

    async def start(self) -> Any:
        t0 = time.monotonic()
        await _RAY_THREAD.run(self._init_ray)
        t1 = time.monotonic()
        self._handle = await self._deploy()
        t2 = time.monotonic()
        self.startup_seconds = {"ray": round(t1 - t0, 1), "replicas": round(t2 - t1, 1)}
        log.info("serving_started", app=self.config.app_name, **self.startup_seconds)
        return self._handle

    def _init_ray(self) -> None:
        import ray
        from ray import serve

        cfg = self.config
        if not ray.is_initialized():
            if cfg.ray_address:
                ray.init(address=cfg.ray_address, log_to_driver=False)
            else:
                need = cfg.replicas * cfg.replica_cpus
                num_cpus = cfg.ray_num_cpus or max(float(os.cpu_count() or 1), need)
                kwargs: dict[str, Any] = {
                    "num_cpus": int(num_cpus + 0.999),
                    "include_dashboard": False,
                    "object_store_memory": cfg.object_store_mb * 1024 * 1024,
                    "log_to_driver": False,
                }
                if cfg.replica_gpus > 0:
                    kwargs["num_gpus"] = int(cfg.replicas * cfg.replica_gpus + 0.999)
                ray.init(**kwargs)
            self._owns_ray = True
        serve.start(proxy_location="Disabled")

    async def _deploy(self) -> Any:
        from ray import serve

        cfg = self.config
        log.info("serving_deploying", **config_summary(cfg))
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
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        try:
            await asyncio.to_thread(serve.delete, self.config.app_name)
        finally:
            if self._owns_ray:
                await _RAY_THREAD.run(serve.shutdown)
                await _RAY_THREAD.run(ray.shutdown)
                self._owns_ray = False
        self._handle = None
        log.info("serving_stopped", app=self.config.app_name)
