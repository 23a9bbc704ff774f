"""A Ray cluster whose nodes are separate hosts (network namespaces, see netns.py), token auth on.

    ray = RayLab(lab, workdir)                   # writes a token file; nothing started yet
    ray.start_head(lab.add_host("head"), cpus=1) # `ray start --head --block` inside the host
    ray.start_node(lab.add_host("w1"), cpus=1)   # `ray start --address head:6379 --block`
    ray.wait_alive(3)                            # polls the cluster (a probe run on the head host)
    ray.replica_nodes("app")                     # replica id -> IP of the node running it

The cluster is started the way an operator starts one: `ray start` with RAY_AUTH_MODE=token and the
token in a file (RAY_AUTH_TOKEN_PATH). Clients (gateways) get `client_env()`: the token file only,
so rollmesh itself must turn token auth on. Every node has its own --temp-dir, so no node (and no
other Ray on this machine) shares sockets or session files with another. Node health checks are
tightened on the head so a lost node is declared dead in seconds, not half a minute.

Tear-down is `NetnsLab.close()` (kills by namespace). Never `ray stop`: it kills every Ray process on
the machine, including other users'.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.multinode.netns import Host
from tests.multinode.netns import NetnsLab

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
GCS_PORT = 6379
_PROBE = Path(__file__).with_name("probe.py")
PROBE_MARK = "PROBE-RESULT "


class RayLab:
    def __init__(self, lab: NetnsLab, workdir: Path) -> None:
        self.lab = lab
        self.workdir = workdir
        self.token_file = workdir / "auth_token"
        self.token_file.write_text(secrets.token_hex(32))
        self.token_file.chmod(0o600)
        self.head: Host | None = None
        self.nodes: dict[str, Host] = {}

    @property
    def address(self) -> str:
        assert self.head is not None, "start_head() first"
        return f"{self.head.ip}:{GCS_PORT}"

    def base_env(self) -> dict[str, str]:
        """What every process of the lab sees: this checkout importable, no usage stats, no Ray
        settings leaking in from the caller's environment."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "ROLLMESH_"))}
        paths = [str(REPO / "services"), str(REPO / "clients" / "python"), str(REPO)]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env["HOME"] = str(self.workdir / "home")  # no ~/.ray/auth_token of the machine's user
        (self.workdir / "home").mkdir(exist_ok=True)
        return env

    def node_env(self) -> dict[str, str]:
        return self.base_env() | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file)}

    def client_env(self) -> dict[str, str]:
        """A client as Ray documents it: the token (file), nothing else."""
        return self.base_env() | {"RAY_AUTH_TOKEN_PATH": str(self.token_file)}

    def _start(self, host: Host, args: list[str], env: Mapping[str, str]) -> None:
        temp_dir = f"/tmp/rm{self.lab.lab_id}{host.name}"  # short: Ray's socket paths must fit 107 bytes
        self.lab.scratch.append(Path(temp_dir))
        host.popen(
            [
                RAY,
                "start",
                *args,
                f"--node-ip-address={host.ip}",
                f"--temp-dir={temp_dir}",
                "--disable-usage-stats",
                "--block",
            ],
            env=env,
            log=self.workdir / f"ray-{host.name}.log",
        )
        self.nodes[host.name] = host

    def start_head(self, host: Host, *, cpus: float) -> None:
        self.head = host
        env = self.node_env() | {
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_timeout_ms": "2000",
            "RAY_health_check_failure_threshold": "3",
        }
        self._start(
            host,
            [
                "--head",
                f"--port={GCS_PORT}",
                f"--num-cpus={cpus:g}",
                "--num-gpus=0",
                "--include-dashboard=false",
                "--object-store-memory=80000000",
            ],
            env,
        )
        self.wait_alive({host.ip})  # nodes that join before the GCS is up may crash

    def start_node(self, host: Host, *, cpus: float) -> None:
        self._start(
            host,
            [
                f"--address={self.address}",
                f"--num-cpus={cpus:g}",
                "--num-gpus=0",
                "--object-store-memory=80000000",
            ],
            self.node_env(),
        )

    def probe(self, *args: str) -> Any:
        """Run probe.py on the head host (a short-lived driver) and return its JSON."""
        assert self.head is not None
        result = self.head.run(
            [sys.executable, str(_PROBE), self.address, *args], env=self.node_env(), timeout_s=120
        )
        if result.returncode != 0:
            raise RuntimeError(f"probe {args} failed ({result.returncode}): {result.stderr[-2000:]}")
        lines = [ln for ln in result.stdout.splitlines() if ln.startswith(PROBE_MARK)]
        if not lines:
            raise RuntimeError(
                f"probe {args} printed no result: {result.stdout[-1000:]} {result.stderr[-1000:]}"
            )
        return json.loads(lines[-1][len(PROBE_MARK) :])

    def alive_nodes(self) -> dict[str, dict[str, float]]:
        """Node IP -> total resources, for nodes the cluster considers alive."""
        nodes: dict[str, dict[str, float]] = self.probe("nodes")
        return nodes

    def wait_alive(self, ips: set[str], *, timeout_s: float = 180) -> dict[str, dict[str, float]]:
        """Wait until exactly the nodes at `ips` are alive."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, dict[str, float]] = {}
        while time.monotonic() < deadline:
            try:
                last = self.alive_nodes()
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                last = {"probe error": {str(exc)[-300:]: 0.0}}
            if set(last) == ips:
                return last
            time.sleep(1.0)
        raise TimeoutError(f"alive nodes never became {sorted(ips)}; last: {last}\n{self.logs()}")

    def replica_nodes(self, app_name: str) -> dict[str, str]:
        """Replica id -> node IP, for the ALIVE replica actors of `app_name`."""
        found: dict[str, str] = self.probe("replicas", app_name)
        return found

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for log in sorted(self.workdir.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)
