"""Joining an existing Ray cluster as a client: token auth, reachability, one-line errors.

- `enable_token_auth(environ)`: Ray 2.60 clusters started with `ray start` run with token auth when
  a token exists, but a client given an explicit address does not turn it on by itself. When
  `RAY_AUTH_MODE` is unset and a token is where Ray documents it (`RAY_AUTH_TOKEN`, the file at
  `RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`), this sets `RAY_AUTH_MODE=token` for this process
  (and the processes it starts), exactly as Ray does for a local `auto` address. An explicit
  `RAY_AUTH_MODE` is always left alone. Returns where the token was found ("" when none).
- `wait_reachable(address, timeout_s)`: a `host:port` address gets a TCP check first, since Ray
  itself retries an unreachable address for minutes; raises `RayUnreachable` in one line.
- `connect_error(address, exc)`: what `ray.init` raised, as one `RollmeshError` with one line:
  `RayAuthFailed` (token missing or wrong), `RayVersionMismatch` (Ray or Python differ from the
  cluster's), `RayNotANode` (a `host:port` address needs a Ray node on this host: a driver talks to
  the cluster through its local raylet), else `RayUnreachable`. The original exception stays chained.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator
from collections.abc import MutableMapping
from pathlib import Path

from rollmesh.mesh.errors import RollmeshError
from rollmesh.serving.errors import RayAuthFailed
from rollmesh.serving.errors import RayNotANode
from rollmesh.serving.errors import RayUnreachable
from rollmesh.serving.errors import RayVersionMismatch

AUTH_MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
_HOST_PORT = re.compile(r"(?:ray://)?(\[[^\]]+\]|[^:/\s]+):(\d+)/?")


def token_source(environ: MutableMapping[str, str]) -> str:
    """Where a Ray auth token is available to this process ("" when nowhere)."""
    if environ.get(TOKEN_VAR, "").strip():
        return TOKEN_VAR
    path = environ.get(TOKEN_PATH_VAR, "")
    if path:
        return f"{TOKEN_PATH_VAR}={path}" if Path(path).expanduser().is_file() else ""
    default = Path(environ.get("HOME") or Path.home()) / ".ray" / "auth_token"
    return str(default) if default.is_file() else ""


def enable_token_auth(environ: MutableMapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    if env.get(AUTH_MODE_VAR):
        return ""
    source = token_source(env)
    if not source:
        return ""
    env[AUTH_MODE_VAR] = "token"
    if env is os.environ:
        # Ray caches its config when it is imported; re-read it so this process sees token mode
        # (what Ray's own `_enable_token_auth` does for a local cluster).
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")
    return source


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of `head:6379` or `ray://head:10001`; None for `auto` and other forms."""
    m = _HOST_PORT.fullmatch(address.strip())
    return (m.group(1).strip("[]"), int(m.group(2))) if m else None


def driver_on_node(address: str) -> bool:
    """True for a `host:port` GCS address: the driver then runs on this host's Ray node."""
    return host_port(address) is not None and not address.strip().startswith("ray://")


def wait_reachable(address: str, *, timeout_s: float) -> None:
    target = host_port(address)
    if target is None:
        return
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            with socket.create_connection(target, timeout=min(5.0, max(0.5, timeout_s))):
                return
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        if time.monotonic() >= deadline:
            raise RayUnreachable(
                f"cannot reach the Ray cluster at {address} ({last} for {timeout_s:.0f}s): is the head "
                "running (`ray start --head`) and is ROLLMESH_RAY_ADDRESS its host:port (default port 6379)?"
            )
        time.sleep(0.5)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _one_line(text: str) -> str:
    return " ".join(text.split())


def connect_error(address: str, exc: BaseException) -> RollmeshError:
    from ray.exceptions import AuthenticationError

    for e in _chain(exc):
        text = str(e)
        if isinstance(e, AuthenticationError) or "InvalidAuthToken" in text:
            if os.environ.get(AUTH_MODE_VAR, "") == "token":
                hint = "the token this process has is not the cluster's"
            else:
                hint = "no token found"
            return RayAuthFailed(
                f"the Ray cluster at {address} rejected this client's auth token ({hint}): copy the head's "
                f"~/.ray/auth_token here, or set {TOKEN_PATH_VAR} (a file) or {TOKEN_VAR} "
                "(`ray get-auth-token` on the head prints it)"
            )
        if "No node info found matching" in text:
            return RayNotANode(
                f"this host is not a node of the Ray cluster at {address}: join it first with "
                f"`ray start --address={address} --num-cpus=0` (deploy/ray-join.sh does this), then "
                "start the gateway"
            )
        if text.startswith("Version mismatch"):
            found = re.findall(r"Ray: (\S+)\s+Python: (\S+)", text)
            if len(found) == 2:
                (ray_c, py_c), (ray_m, py_m) = found
                detail = f"cluster Ray {ray_c} / Python {py_c}, this process Ray {ray_m} / Python {py_m}"
            else:
                detail = _one_line(text)[:300]
            return RayVersionMismatch(
                f"the Ray cluster at {address} runs other versions ({detail}): install the cluster's "
                "Ray and Python versions here"
            )
    return RayUnreachable(
        f"cannot connect to the Ray cluster at {address}: {_one_line(str(exc))[:300] or type(exc).__name__}"
    )
