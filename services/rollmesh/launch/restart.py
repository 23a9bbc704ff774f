"""When `rollmesh up` restarts a child that died, and when it gives up (compose's `restart:`).

- `RestartPolicy.mode`: `no` (never restart: the mesh stops and `up` exits 1), `on-failure`
  (restart when the exit code is non-zero or a signal killed it; the default) or `always`
  (restart on any exit, 0 included).
- Restarts are bounded: at most `max_restarts` restarts of one service within `window_s`
  seconds; the next death in the window makes `up` give up (stop every child, exit 1).
- Backoff before restart n (counted within the window, from 0): `backoff_s * 2**n`, capped at
  `backoff_max_s`; restarts that fell out of the window no longer count, so a service that was
  stable for a window starts again from the short delay.
"""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field

from rollmesh.mesh import config
from rollmesh.mesh.errors import ConfigError

MODES = ("no", "on-failure", "always")


@dataclass(frozen=True)
class RestartPolicy:
    mode: str = config.setting("ROLLMESH_RESTART")
    max_restarts: int = config.setting("ROLLMESH_RESTART_MAX")
    window_s: float = config.setting("ROLLMESH_RESTART_WINDOW_S")
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"restart policy {self.mode!r} is not one of {', '.join(MODES)}")
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ConfigError("max restarts must be >= 0 and the restart window > 0 seconds")

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        mode: str | None = None,
        max_restarts: int | None = None,
        window_s: float | None = None,
    ) -> RestartPolicy:
        """Flags given here win over ROLLMESH_RESTART, ROLLMESH_RESTART_MAX, ROLLMESH_RESTART_WINDOW_S."""
        flags = {"mode": mode or None, "max_restarts": max_restarts, "window_s": window_s}
        return config.read_fields(cls, environ, **flags)

    def wants_restart(self, returncode: int) -> bool:
        return self.mode == "always" or (self.mode == "on-failure" and returncode != 0)


@dataclass
class RestartBudget:
    """One service's restarts within the policy's window."""

    policy: RestartPolicy
    times: deque[float] = field(default_factory=deque)

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next restart (and count it), or None: the budget is spent."""
        while self.times and now - self.times[0] > self.policy.window_s:
            self.times.popleft()
        if len(self.times) >= self.policy.max_restarts:
            return None
        delay = min(self.policy.backoff_s * float(2 ** len(self.times)), self.policy.backoff_max_s)
        self.times.append(now + delay)
        return delay

    @property
    def used(self) -> int:
        return len(self.times)


def describe_exit(returncode: int) -> str:
    """'exited with code 3' or 'was killed by signal SIGKILL' (asyncio reports a signal as -N)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"was killed by signal {name}"
    return f"exited with code {returncode}"
