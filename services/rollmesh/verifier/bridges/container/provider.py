"""The one interface machine providers implement (daemonless.py, docker.py), and what they share.

A provider turns a `Recipe` (images.py) into an `Image` once per content digest (cached; the task's
build timeout honoured), starts a `Machine` of an image per rollout with the task's `Limits`,
labelled with its job and rollout, and removes it with the rollout. `sweep()` removes the machines a
dead owner left behind (a SIGKILLed verifier): it runs when the provider starts. `live()` lists the
machines it runs now (`rollmesh envs status`).

A machine runs commands (`exec`: argv, stdin bytes, a timeout, an output cap, user, folder,
variables) and takes files (`put_tree`, `put_file`: a tar stream into `tar -x` in the machine, so no
host path ever resolves inside the machine's filesystem, where a symlink could point back out).
"""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import time
from abc import ABC
from abc import abstractmethod
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from rollmesh.verifier.bridges.container.errors import ImageBuildFailed
from rollmesh.verifier.bridges.container.errors import MachineLost
from rollmesh.verifier.bridges.container.images import Recipe
from rollmesh.verifier.bridges.container.images import Service
from rollmesh.verifier.bridges.container.task import Limits

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Image:
    """A built image: its id (content digest), the variables, folder and user its Dockerfile set."""

    id: str
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    user: str = ""
    #: The provider's own handle (a Docker tag; the daemonless provider's layer folders, top first).
    ref: str = ""
    layers: tuple[str, ...] = ()
    #: The compose file's services besides `main`, each with its own image (a provider that runs them).
    services: tuple[tuple[Service, Image], ...] = ()


@dataclass(frozen=True)
class Labels:
    """Who a machine belongs to; every machine carries them (`rollmesh envs status` shows them)."""

    job: str
    rollout: str
    environment: str = ""
    task: str = ""


@dataclass(frozen=True)
class MachineInfo:
    id: str
    provider: str
    labels: Labels
    started: float
    owner_pid: int = 0


@dataclass(frozen=True)
class Command:
    """One command to run in a machine: argv, the bytes of its stdin, its timeout, the output cap
    (per stream), and the user, folder and extra variables it runs with (the image's by default)."""

    argv: list[str]
    stdin: bytes
    timeout_s: float
    output_limit: int
    user: str = ""
    cwd: str = ""
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecResult:
    """A command's end: its exit status (128+N for signal N; -1 when it was cut by its timeout), its
    output (head and tail kept within the cap) and whether any was dropped."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0


class Machine(ABC):
    def __init__(self, machine_id: str, labels: Labels, image: Image, started: float | None = None) -> None:
        self.id = machine_id
        self.labels = labels
        self.image = image
        self.started = time.time() if started is None else started
        self._removal: asyncio.Future[None] | None = None

    @property
    def removed(self) -> bool:
        return self._removal is not None

    async def exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes = b"",
        timeout_s: float,
        output_limit: int,
        user: str = "",
        cwd: str = "",
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run `argv` in the machine; raises MachineLost when the machine is gone."""
        return await self._run(
            Command(list(argv), stdin, timeout_s, output_limit, user, cwd, dict(env or {}))
        )

    @abstractmethod
    async def _run(self, command: Command) -> ExecResult:
        """What `exec` does."""

    async def remove(self) -> None:
        """Stop and delete the machine and everything it wrote: once, whoever asks (a second call
        waits for the first's removal), and to the end even when the caller is cancelled."""
        if self._removal is None:
            self._removal = asyncio.ensure_future(self._delete())
        await asyncio.shield(self._removal)

    @abstractmethod
    async def _delete(self) -> None:
        """What `remove` does, once."""

    @abstractmethod
    def lost(self) -> str:
        """Why the machine is gone while still in use ("" while it runs)."""

    def command_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8", **self.image.env}
        env.update(extra or {})
        return env

    async def put_file(self, path: str, data: bytes, *, mode: int = 0o644, timeout_s: float = 60.0) -> None:
        folder, _, name = path.rstrip("/").rpartition("/")
        await self._untar(tar_of({name: (data, mode)}), folder or "/", timeout_s)

    async def put_tree(self, source: Path, dest: str, *, before: str = "", timeout_s: float = 120.0) -> None:
        """Copy the folder `source` to `dest` in the machine (made when missing; symlinks skipped),
        after the shell commands `before` (one call in all)."""
        data = await asyncio.to_thread(tree_tar, source)
        await self._untar(data, dest, timeout_s, before)

    async def _untar(self, data: bytes, dest: str, timeout_s: float, before: str = "") -> None:
        script = before + 'mkdir -p "$1" && exec tar -x --no-same-owner -C "$1"'
        result = await self.exec(
            ["/bin/sh", "-c", script, "put", dest],
            stdin=data,
            timeout_s=timeout_s,
            output_limit=4096,
            user="0",
        )
        self._copied(result, dest)

    def _copied(self, result: ExecResult, dest: str) -> None:
        """Raise for a copy into `dest` that failed: the image lacks /bin/sh or tar (exit 127), else
        the machine is in no state to go on."""
        if result.exit_code == 0:
            return
        detail = (result.stderr or result.stdout).decode(errors="replace").strip()[-300:]
        if result.exit_code == 127:
            raise ImageBuildFailed(
                f"machine {self.id}: copying files in needs /bin/sh and tar in the image: {detail}",
                metadata={"machine": self.id},
            )
        raise MachineLost(
            f"machine {self.id}: copying files into {dest} failed (exit {result.exit_code}): {detail}",
            metadata={"machine": self.id},
        )


def tree_tar(source: Path, extra: Mapping[str, tuple[bytes, int]] | None = None, *, root: str = "") -> bytes:
    """The files of the folder `source` (symlinks skipped), and `extra` ones, as a tar stream; with
    `root`, inside a folder of that name (made even when `source` is empty). Blocking."""
    files: dict[str, tuple[bytes, int]] = dict(extra or {})
    for path in sorted(source.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[str(path.relative_to(source))] = (path.read_bytes(), path.stat().st_mode & 0o777)
    if root:
        files = {f"{root}/{name}": file for name, file in files.items()}
    return tar_of(files, folders=(root,) if root else ())


def tar_of(files: Mapping[str, tuple[bytes, int]], folders: Sequence[str] = ()) -> bytes:
    """A tar stream of `files` (name -> content and mode), their folders made (0755), and `folders`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made: set[str] = set()
        for name, (data, mode) in [*((f"{f}/", (b"", 0)) for f in folders), *files.items()]:
            parts = name.split("/")[:-1]
            for n in range(1, len(parts) + 1):
                folder = "/".join(parts[:n])
                if folder not in made:
                    made.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
                    tar.addfile(info)
            if name.endswith("/"):
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Relabelling(ABC):
    """A machine that can be given to a rollout after it started (a warm machine): its labels
    become the rollout's. A provider whose machines are Relabelling says so with `relabels`."""

    @abstractmethod
    async def relabel(self, labels: Labels) -> None:
        """Label the machine as the rollout's (where the provider keeps its labels too)."""


class Provider(ABC):
    #: "daemonless" or "docker" (what `rollmesh envs list` shows).
    name = ""
    #: Its machines are `Relabelling`, so they can be started ahead (warm). A provider without it
    #: refuses `warm` when the environment is configured (`ContainerTasksEnvironment`).
    relabels = False
    #: Why it cannot run machines started ahead, for that refusal.
    relabels_not = ""

    def __init__(self) -> None:
        #: The rollouts' machines this provider started, until they are removed.
        self.machines: dict[str, Machine] = {}

    async def open(self) -> None:
        """Called once when the environment starts: probe what it needs, then `sweep()`."""
        await self.sweep()

    @abstractmethod
    async def prepare(self, recipe: Recipe, *, timeout_s: float, where: str) -> Image:
        """The recipe's image, built once per content digest (raises ImageBuildFailed /
        ImageBuildTimeout / ProviderUnavailable)."""

    @abstractmethod
    async def start(self, image: Image, limits: Limits, labels: Labels) -> Machine:
        """A fresh machine of `image` under `limits` (raises MachineStartFailed)."""

    @abstractmethod
    async def sweep(self) -> int:
        """Remove the machines whose owner is gone; how many."""

    def live(self) -> list[MachineInfo]:
        """The machines this provider runs for this process now."""
        return [
            MachineInfo(m.id, self.name, m.labels, m.started, os.getpid())
            for m in list(self.machines.values())
            if not m.lost()
        ]

    async def remove(self, machine: Machine) -> None:
        """Remove a rollout's machine and forget it once it is gone."""
        try:
            await machine.remove()
        finally:
            self.machines.pop(machine.id, None)

    def problem(self) -> str:
        """Why it cannot run machines here ("" when it can)."""
        return ""

    async def aclose(self) -> None:
        """Remove every machine still there (those being removed too, to the end)."""
        machines = list(self.machines.values())
        await asyncio.gather(*(self.remove(m) for m in machines), return_exceptions=True)


class CappedOutput:
    """A pipe's bytes within `cap`: the first and last halves kept, what was dropped between counted."""

    def __init__(self, cap: int) -> None:
        self.cap = max(cap, 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - (self.cap - self.cap // 2))]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def value(self) -> bytes:
        if not self.truncated:
            return bytes(self.head + self.tail)
        dropped = self.total - len(self.head) - len(self.tail)
        return bytes(self.head) + f"\n[... {dropped} bytes dropped ...]\n".encode() + bytes(self.tail)


async def drain(reader: asyncio.StreamReader, out: CappedOutput) -> None:
    while chunk := await reader.read(1 << 16):
        out.add(chunk)


def process_alive(pid: int, start_ticks: int) -> bool:
    """Whether `pid` runs and is the process that started at `start_ticks` (not a reused pid)."""
    return pid > 0 and process_start(pid) == start_ticks


def process_start(pid: int) -> int:
    """The start time of `pid` in clock ticks since boot (/proc/PID/stat field 22); 0 when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])


def owner_identity() -> tuple[int, int]:
    return os.getpid(), process_start(os.getpid())
