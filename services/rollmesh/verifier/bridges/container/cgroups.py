"""A machine's cgroup limits, where the kernel offers them (cgroup v2, else v1's memory, pids and cpu
controllers): memory (no swap beyond it), processes, CPU time. Each machine gets
`<controller root>/rollmesh-machines/<machine id>`; the machine's first process joins it before
anything else runs, so all it starts is counted. `available()` says which limits hold here (what
`rollmesh envs list` reports and the docs call "where the kernel offers them").

Blocking (small writes to /sys/fs/cgroup): call off the event loop.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rollmesh.verifier.bridges.container.task import Limits

ROOT = Path("/sys/fs/cgroup")
PARENT = "rollmesh-machines"
DEFAULT_PIDS = 4096
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Layout:
    """Where each controller lives: v2's one tree, or v1's folders by controller."""

    unified: Path | None
    v1: dict[str, Path]

    def kinds(self) -> list[str]:
        if self.unified is not None:
            found = (self.unified / "cgroup.controllers").read_text().split()
            return [k for k in ("memory", "pids", "cpu") if k in found]
        return sorted(self.v1)


def layout(root: Path = ROOT) -> Layout:
    if (root / "cgroup.controllers").is_file():
        return Layout(root, {})
    found = {}
    for kind in ("memory", "pids", "cpu"):
        folder = root / kind
        if (folder / "cgroup.procs").is_file() and os.access(folder, os.W_OK):
            found[kind] = folder
    return Layout(None, found)


def available(root: Path = ROOT) -> list[str]:
    """The limits machines get here ("memory", "pids", "cpu"), [] when none."""
    try:
        return layout(root).kinds()
    except OSError:
        return []


def create(machine_id: str, limits: Limits, root: Path = ROOT) -> list[str]:
    """The machine's cgroup folders, limits written; [] when the kernel offers none."""
    found = layout(root)
    folders: list[str] = []
    if found.unified is not None:
        parent = found.unified / PARENT
        parent.mkdir(exist_ok=True)
        kinds = found.kinds()
        with contextlib.suppress(OSError):
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{k}" for k in kinds))
        folder = parent / machine_id
        folder.mkdir()
        folders.append(str(folder))
        if limits.memory_mb and "memory" in kinds:
            (folder / "memory.max").write_text(str(limits.memory_mb << 20))
            with contextlib.suppress(OSError):
                (folder / "memory.swap.max").write_text("0")
        if "pids" in kinds:
            (folder / "pids.max").write_text(str(DEFAULT_PIDS))
        if limits.cpus and "cpu" in kinds:
            (folder / "cpu.max").write_text(f"{int(limits.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}")
        return folders
    for kind, base in found.v1.items():
        folder = base / PARENT / machine_id
        folder.mkdir(parents=True)
        folders.append(str(folder))
        if kind == "memory" and limits.memory_mb:
            (folder / "memory.limit_in_bytes").write_text(str(limits.memory_mb << 20))
            with contextlib.suppress(OSError):  # no swap accounting: nothing to cap
                (folder / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb << 20))
        elif kind == "pids":
            (folder / "pids.max").write_text(str(DEFAULT_PIDS))
        elif kind == "cpu" and limits.cpus:
            (folder / "cpu.cfs_period_us").write_text(str(_CPU_PERIOD_US))
            (folder / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * _CPU_PERIOD_US)))
    return folders


def kill_and_remove(folders: list[str], *, wait_s: float = 5.0) -> None:
    """SIGKILL every process left in the folders, then remove them (a folder whose processes take
    longer than `wait_s` to die is left for the next sweep)."""
    deadline = time.monotonic() + wait_s
    for folder in folders:
        path = Path(folder)
        while path.is_dir():
            pids = _pids(path)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)


def machine_folders(machine_id: str, root: Path = ROOT) -> list[str]:
    """Every cgroup folder of `machine_id` that exists (for a sweep that lost the machine's record)."""
    found = layout(root)
    bases = [found.unified] if found.unified is not None else list(found.v1.values())
    return [str(b / PARENT / machine_id) for b in bases if (b / PARENT / machine_id).is_dir()]


def oom_killed(folders: list[str]) -> bool:
    """Whether the kernel killed a process of the machine for its memory limit."""
    for folder in folders:
        with contextlib.suppress(OSError):
            events = (Path(folder) / "memory.events").read_text()
            if any(
                line.split()[0] == "oom_kill" and int(line.split()[1]) > 0 for line in events.splitlines()
            ):
                return True
        with contextlib.suppress(OSError):
            for line in (Path(folder) / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill ") and int(line.split()[1]) > 0:
                    return True
    return False


def _pids(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []
