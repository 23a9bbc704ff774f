"""Hosts on this machine: Linux network namespaces with their own address on a private bridge.

    lab = NetnsLab.create()              # bridge + /24; raises LabUnavailable(reason) when it cannot
    head = lab.add_host("head")          # a namespace with eth0 = 10.x.y.11, default route via the bridge
    proc = head.popen(["ray", "start", ...], log=path)
    lab.cut(head); lab.restore(head)     # link down / up: the host drops off the network and returns
    lab.kill_host(head)                  # SIGKILL every process in the namespace (by pid)
    lab.close()                          # kill every process in every namespace, delete them and the bridge

Every name carries a random lab id, so parallel labs (and other users of the machine) never collide.
Processes are found by namespace (`ip netns pids`), never by name: nothing outside the lab is touched.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path


class LabUnavailable(RuntimeError):
    """This machine cannot host namespaced hosts here; the message says why (for a pytest skip)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class Host:
    name: str  # short name given by the test ("head", "w1", ...)
    netns: str
    ip: str
    veth: str  # the bridge-side end, in the root namespace
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, args: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *args]

    def popen(self, args: Sequence[str], *, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
        """Start `args` inside this host, output to `log`, in its own session (killed by `kill_host`)."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.command(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def run(
        self, args: Sequence[str], *, env: Mapping[str, str], timeout_s: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(args), env=dict(env), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]


class NetnsLab:
    """A bridge and the hosts attached to it. Use `create()`; always `close()` (it is idempotent)."""

    def __init__(self, lab_id: str, subnet: str) -> None:
        self.lab_id = lab_id
        self.subnet = subnet  # "10.a.b": hosts get .11, .12, ...; the bridge is .1
        self.bridge = f"rm{lab_id}b"
        self.hosts: dict[str, Host] = {}
        self.gateway_ip = f"{subnet}.1"
        self.scratch: list[Path] = []  # directories removed by close()
        self._closed = False

    @classmethod
    def create(cls) -> NetnsLab:
        if os.geteuid() != 0:
            raise LabUnavailable("network namespaces need root (ip netns add); this test runs as non-root")
        if shutil.which("ip") is None:
            raise LabUnavailable("iproute2's `ip` is not installed (apt-get install iproute2)")
        lab = cls(uuid.uuid4().hex[:6], f"10.{random.randint(200, 250)}.{random.randint(0, 255)}")
        try:
            _ip("link", "add", lab.bridge, "type", "bridge")
            _ip("addr", "add", f"{lab.gateway_ip}/24", "dev", lab.bridge)
            _ip("link", "set", lab.bridge, "up")
        except subprocess.CalledProcessError as exc:
            lab.close()
            raise LabUnavailable(f"cannot create a bridge: {exc.stderr.strip()}") from exc
        return lab

    def add_host(self, name: str) -> Host:
        index = len(self.hosts)
        host = Host(
            name, f"rm{self.lab_id}-{name}", f"{self.subnet}.{11 + index}", f"rm{self.lab_id}v{index}"
        )
        try:
            _ip("netns", "add", host.netns)
            self.hosts[name] = host
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            _ip("link", "set", host.veth, "master", self.bridge, "up")
            for args in (
                ("addr", "add", f"{host.ip}/24", "dev", "eth0"),
                ("link", "set", "eth0", "up"),
                ("link", "set", "lo", "up"),
                ("route", "add", "default", "via", self.gateway_ip),
            ):
                _ip("-n", host.netns, *args)
        except subprocess.CalledProcessError as exc:
            raise LabUnavailable(
                f"cannot create network namespace host {name}: {exc.stderr.strip()}"
            ) from exc
        return host

    def cut(self, host: Host) -> None:
        """Take the host's link down: its processes live on, unreachable (a network partition)."""
        _ip("link", "set", host.veth, "down")

    def restore(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    def kill_host(self, host: Host) -> None:
        """SIGKILL every process in the host's namespace (the machine lost power), then reap them."""
        for _ in range(20):  # a dying Ray node may still fork for a moment
            pids = host.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for proc in host.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        host.procs.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            self.kill_host(host)
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.netns, check=False)
        _ip("link", "del", self.bridge, check=False)
        for path in self.scratch:
            shutil.rmtree(path, ignore_errors=True)
