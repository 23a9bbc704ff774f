"""What every bridge to a foreign environment server shares (NeMo Gym's resources servers, verifiers'
environments): the server run by the verifier as a sidecar in its own interpreter (launch/sidecar.py)
or reached at a URL, the HTTP bridge to it (http_bridge.py), and reading its numbers.

- `ForeignServerEnvironment`: an Environment whose answers come from such a server: `sidecar` (None
  for a server attached by URL) and `http`; start, close, whether it can serve (`problem`), its
  restarts and what confines it, and a session's state checked against the server's restarts
  (`session_state`: a restarted server lost it), once for every bridge. `discover()` (a bridge's
  reading of what the server offers: routes, schemas) runs at start; a server that is unreachable
  then (attached by URL, started with the verifier by a compose stack) is BROKEN and probed again
  with backoff (0.5 s doubling to 10 s) until `discovered()`, without waiting for a first session.
- `sidecar_spec`: how the verifier runs a foreign server: logs and port file under
  ROLLMESH_SIDECAR_LOG_DIR (default <tmp>/rollmesh-sidecars), restarted always (at most 5 times in
  300 s), confined as ROLLMESH_SIDECAR_CONFINE says, with `foreign_env()` and unbuffered output.
- `BridgeConfig`: what every kind's file (nemo_gym.toml, verifiers.toml, openenv.toml) says of its
  server besides the kind's own keys (a description, a managed server's interpreter, its timeouts),
  and reading that file (`load`: http_bridge.py's `bridge_config`, then the kind's own checks).
- `reward_of`, `numbers_of`: a reply's reward (a number, or EnvServerBadReply) and a map of named
  numbers (what is not a number is left out).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import os
import tempfile
import uuid
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import ClassVar
from typing import Protocol
from typing import Self
from typing import TypeVar

from rollmesh.launch.restart import RestartPolicy
from rollmesh.launch.sidecar import Sidecar
from rollmesh.launch.sidecar import SidecarSpec
from rollmesh.launch.sidecar import State
from rollmesh.mesh import config as mesh_config
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.logging import get_logger
from rollmesh.verifier.bridges.http_bridge import HttpBridge
from rollmesh.verifier.bridges.http_bridge import bridge_config
from rollmesh.verifier.bridges.http_bridge import built
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import Environment
from rollmesh.verifier.environment import Session
from rollmesh.verifier.errors import EnvServerBadReply
from rollmesh.verifier.errors import EnvServerTimeout
from rollmesh.verifier.errors import EnvServerUnreachable
from rollmesh.verifier.errors import EnvSessionLost

log = get_logger("rollmesh.verifier.bridges.foreign")


class _Seeded(Protocol):
    incarnation: int  # the server's life (`server_incarnation()`) when it seeded the session


S = TypeVar("S", bound=_Seeded)


def foreign_env() -> dict[str, str]:
    """This process's environment without rollmesh's own variables (its API key among them) and
    without the interpreter settings of rollmesh's virtualenv: what a foreign server starts with."""
    drop = ("ROLLMESH_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@dataclass(frozen=True, kw_only=True)
class BridgeConfig(abc.ABC):
    """A kind's file (`config_file`), paths resolved against its folder: the keys every kind has
    (below), then the kind's own (a subclass's fields).

    `load` reads it checked (http_bridge.py's `bridge_config`: `required` is the key, or one of the
    keys, it must give, which `required_what` describes; the `path_keys` are resolved against the
    folder), then runs the kind's own checks (`checked`)."""

    description: str = ""
    #: A managed server's interpreter (or `venv` = its bin/python); "": the `python_var` variable's.
    python: str = ""
    timeout_s: float = 60.0  # per HTTP call
    start_timeout_s: float = 180.0  # for a managed server to serve

    config_file: ClassVar[str]
    python_var: ClassVar[str]
    required: ClassVar[str | tuple[str, ...]]
    required_what: ClassVar[str]
    path_keys: ClassVar[tuple[str, ...]] = ("python",)

    @classmethod
    def load(cls, folder: Path) -> Self:
        path = folder / cls.config_file
        keys = [f.name for f in dataclasses.fields(cls)]
        raw = bridge_config(path, keys, cls.required, cls.required_what, paths=cls.path_keys)
        return built(cls, cls.checked(raw, folder, path), path)

    @classmethod
    def checked(cls, raw: dict[str, Any], folder: Path, path: Path) -> dict[str, Any]:
        """The file's keys after the kind's own checks (a ConfigError naming `path`); none here."""
        del folder, path
        return raw

    @property
    @abc.abstractmethod
    def who(self) -> str:
        """The server, as an error about its interpreter names it."""

    def interpreter(self) -> str:
        """A managed server's interpreter: `python`, else `python_var`'s value; a ConfigError naming
        the server and what to set when neither names one."""
        chosen = self.python or str(mesh_config.read(self.python_var))
        if not chosen:
            raise ConfigError(
                f"{self.who} names no interpreter: set `python` or `venv` in {self.config_file}, "
                f"or {self.python_var}"
            )
        return chosen


def sidecar_spec(
    *,
    tag: str,
    name: str,
    argv: tuple[str, ...],
    env: Mapping[str, str],
    probe: Callable[[str], Awaitable[bool]],
    start_timeout_s: float,
    readable: Sequence[str],
) -> SidecarSpec:
    """The sidecar of a foreign server (module docstring); `tag` names its log and port files,
    `env` is added to `foreign_env()`, `readable` is what a confined server may read."""
    logs = Path(
        str(mesh_config.read("ROLLMESH_SIDECAR_LOG_DIR")) or Path(tempfile.gettempdir()) / "rollmesh-sidecars"
    )
    tag = f"{tag}-{uuid.uuid4().hex[:8]}"
    return SidecarSpec(
        name=name,
        argv=argv,
        log_path=logs / f"{tag}.log",
        port_file=logs / f"{tag}.addr",
        probe=probe,
        env={**foreign_env(), **env, "PYTHONUNBUFFERED": "1"},
        restart=RestartPolicy(mode="always", max_restarts=5, window_s=300.0),
        start_timeout_s=start_timeout_s,
        confine=bool(mesh_config.read("ROLLMESH_SIDECAR_CONFINE")),
        readable=list(readable),
    )


def folder_of(context: EnvContext, what: str, config_file: str) -> Path:
    """The folder of a bridged environment (`what`, e.g. "a NeMo Gym environment"), which holds
    its `config_file`; a ConfigError when it has none."""
    if context.path is None:
        raise ConfigError(f"{what} needs its folder (holding {config_file})")
    return context.path


class ForeignServerEnvironment(Environment):
    """An environment a foreign server answers; a subclass calls `attach` in __init__."""

    sidecar: Sidecar | None
    http: HttpBridge
    _url: str  # attached by URL: where the server answers
    #: The probing of a server that was unreachable at start, until it is discovered.
    _discovery: asyncio.Task[None] | None = None

    def attach(self, label: str, url: str, timeout_s: float, sidecar: Sidecar | None) -> None:
        """The server: managed by `sidecar`, or attached at `url` (sidecar None); and the HTTP bridge
        to it (`label` names the server in its errors), which waits for a managed server to be ready
        again before it retries a call that found none."""
        self.sidecar = sidecar
        self._url = url
        wait_ready = sidecar.ready if sidecar is not None else None
        self.http = HttpBridge(label, self.base_url, timeout_s=timeout_s, wait_ready=wait_ready)

    def base_url(self) -> str:
        """Where the server answers now: a managed server's address (a restart may change it), else
        the URL it is attached at."""
        return f"http://{self.sidecar.address}" if self.sidecar is not None else self._url

    async def discover(self) -> None:
        """Read what the server offers (module docstring); the default reads nothing."""

    def discovered(self) -> bool:
        """Whether `discover()` has read what it needs (a server still warming up may answer badly)."""
        return True

    async def start(self) -> None:
        await self.http.open()
        if self.sidecar is not None:
            await self.sidecar.start()
        try:
            await self.discover()
        except EnvServerUnreachable as exc:  # attached by URL and not up yet: listed broken until it is
            log.warning("foreign_server_unreachable", environment=self.context.name, error=exc.message)
            self._discovery = asyncio.create_task(self._discover_when_up())

    async def _discover_when_up(self) -> None:
        delay = 0.5
        while not self.discovered():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
            try:
                await self.discover()
            except (EnvServerUnreachable, EnvServerTimeout):
                continue

    async def aclose(self) -> None:
        if self._discovery is not None:
            self._discovery.cancel()
            await asyncio.gather(self._discovery, return_exceptions=True)
        await self.http.aclose()
        if self.sidecar is not None:
            await self.sidecar.stop()

    def problem(self) -> str:
        if self.sidecar is not None and self.sidecar.state is not State.SERVING:
            return self.sidecar.problem or f"{self.sidecar.describe()} is {self.sidecar.state.value}"
        return self.http.down

    def server_restarts(self) -> int:
        return self.sidecar.restarts if self.sidecar is not None else 0

    def server_incarnation(self) -> int:
        """Which life of the managed server this is (launch/sidecar.py `incarnation`: counted when
        the last one ended, before the next starts); what a session's state is checked against."""
        return self.sidecar.incarnation if self.sidecar is not None else 0

    def session_state(self, session: Session, kind: type[S]) -> S:
        """`session.state` (a `kind`); EnvSessionLost when the server restarted after seeding it."""
        state = session.state
        assert isinstance(state, kind)
        if state.incarnation != self.server_incarnation():
            raise EnvSessionLost(
                f"{self.http.name} restarted after session {session.id!r} was seeded: "
                "its state is gone, the rollout is retried"
            )
        return state

    def managed_by(self) -> str:
        """How the verifier runs the server, for summaries: "managed by the verifier (<interpreter>,
        isolation uid+mount+pid)"; "" for a server it does not run."""
        if self.sidecar is None:
            return ""
        isolation = f", isolation {self.sidecar.isolation}" if self.sidecar.isolation else ""
        return f"managed by the verifier ({self.sidecar.spec.argv[0]}{isolation})"

    def sandbox_mode(self) -> str:
        """What confines the server the verifier manages (launch/sidecar.py: "uid+mount+pid",
        "limits", "none"); "" for a server it does not run."""
        return self.sidecar.isolation if self.sidecar is not None else ""


def reward_of(reply: Mapping[str, Any], where: str, route: str) -> float:
    """The reply's `reward`; EnvServerBadReply naming `where` and `route` when it is not a number."""
    reward = reply.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise EnvServerBadReply(
            f"{where}: {route} answered without a numeric reward (reward = {reward!r:.80})"
        )
    return float(reward)


def numbers_of(raw: Any) -> dict[str, float]:
    """A map's numeric values by name (booleans and anything else left out; not a map: none)."""
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
