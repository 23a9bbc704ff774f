"""The daemonless provider: machines on the project's own confinement, no Docker daemon.

Images: a recipe's base must be a local base (`rollmesh-base:<suite>`, bases.py; the image map
renames others to one). Its steps are built once per content digest into a layer folder under
`$ROLLMESH_CACHE_DIR/container-images/<digest>/` by running them in a build machine (the base's
filesystem read-only below, the layer as its writable overlay, the host's network): RUN (shell and
JSON forms), COPY and ADD of local files (no `--from`, no URLs, no archive unpacking), ENV, ARG,
WORKDIR, USER; LABEL, EXPOSE, CMD, ENTRYPOINT, STOPSIGNAL, HEALTHCHECK and VOLUME are recorded or
ignored, as a machine that only runs commands needs; any other instruction fails the build by name.

Machines: each is `_machine.py` (its docstring is the contract): an overlay of the image's layers
with a fresh tmpfs of `storage_mb` on top, its own user namespace (a block of host uids leased for
its lifetime, the layers idmapped into it; `user_namespaces`), mount, pid, UTS, IPC and (unless the
task allows the internet) network namespaces, the host's filesystem unmounted from its view, the capability
bounding set of a Docker container, and a cgroup with the task's memory, CPU and process limits
where the kernel offers them (cgroups.py). Its folder `/run/rollmesh/machines/<id>/` holds its
labels (`label.json`: job, rollout, environment, task, owner pid) and control socket; it dies with
the verifier (a death signal), and `sweep()` removes what a SIGKILLed verifier left: folders whose
owner is gone and their cgroups. Needs root (mounts, namespaces) and overlayfs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from pathlib import PurePosixPath
from typing import Any

from rollmesh.mesh import config as mesh_config
from rollmesh.mesh.logging import get_logger
from rollmesh.verifier.bridges.container import bases
from rollmesh.verifier.bridges.container import cgroups
from rollmesh.verifier.bridges.container.errors import ImageBuildFailed
from rollmesh.verifier.bridges.container.errors import ImageBuildTimeout
from rollmesh.verifier.bridges.container.errors import MachineLost
from rollmesh.verifier.bridges.container.errors import MachineStartFailed
from rollmesh.verifier.bridges.container.errors import ProviderUnavailable
from rollmesh.verifier.bridges.container.errors import ServicesUnsupported
from rollmesh.verifier.bridges.container.images import Instruction
from rollmesh.verifier.bridges.container.images import Recipe
from rollmesh.verifier.bridges.container.images import key_values
from rollmesh.verifier.bridges.container.provider import CappedOutput
from rollmesh.verifier.bridges.container.provider import Command
from rollmesh.verifier.bridges.container.provider import ExecResult
from rollmesh.verifier.bridges.container.provider import Image
from rollmesh.verifier.bridges.container.provider import Labels
from rollmesh.verifier.bridges.container.provider import Machine
from rollmesh.verifier.bridges.container.provider import Provider
from rollmesh.verifier.bridges.container.provider import Relabelling
from rollmesh.verifier.bridges.container.provider import drain
from rollmesh.verifier.bridges.container.provider import owner_identity
from rollmesh.verifier.bridges.container.provider import process_alive
from rollmesh.verifier.bridges.container.provider import process_start
from rollmesh.verifier.bridges.container.task import Limits

log = get_logger("rollmesh.verifier.container.daemonless")

RUNNER = Path(__file__).with_name("_machine.py")
MACHINES_DIR = Path(str(mesh_config.read("ROLLMESH_MACHINES_DIR")))
DEFAULT_STORAGE_MB = 4096
START_TIMEOUT_S = 60.0
_ARCHIVES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2")
_IGNORED = {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "STOPSIGNAL", "HEALTHCHECK", "VOLUME", "MAINTAINER"}


UID_BLOCK_BASE, UID_BLOCK, UID_BLOCKS = 2_000_000_000, 65536, 1024
UID_LEASES = Path(str(mesh_config.read("ROLLMESH_MACHINE_UID_LEASES")))


def user_namespaces() -> bool:
    """Each rollout's machine maps its uids 0-65535 to a block of host uids of its own, leased
    host-wide (an flock per block under UID_LEASES, held while the machine lives), unless
    ROLLMESH_CONTAINER_USERNS is off (the machine's root is then the host's root, confined as
    Docker's is); a value that is not a boolean is a ConfigError."""
    return bool(mesh_config.read("ROLLMESH_CONTAINER_USERNS"))


def lease_uid_block() -> tuple[int, int]:
    """A free block of host uids (its first uid) and its lease's descriptor (close it to free it)."""
    UID_LEASES.mkdir(parents=True, exist_ok=True, mode=0o700)
    first = secrets.randbelow(UID_BLOCKS)
    for n in range(UID_BLOCKS):
        block = (first + n) % UID_BLOCKS
        fd = os.open(UID_LEASES / f"{block}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return UID_BLOCK_BASE + block * UID_BLOCK, fd
    raise MachineStartFailed(f"all {UID_BLOCKS} uid blocks are leased: no machine can start now")


def images_dir() -> Path:
    return bases.cache_root() / "container-images"


class DaemonlessMachine(Machine, Relabelling):
    def __init__(
        self,
        machine_id: str,
        labels: Labels,
        image: Image,
        folder: Path,
        keeper: int,
        cgroup_folders: list[str],
        uid_lease: int = -1,
    ) -> None:
        super().__init__(machine_id, labels, image)
        self.uid_lease = uid_lease  # the flocked lease of its uid block (-1: none)
        self.folder = folder
        self.keeper = keeper
        self.cgroups = cgroup_folders
        self._gone = asyncio.Event()
        self._pidfd = -1
        try:  # the keeper is the factory's child, not ours: its pidfd says when it ends
            self._pidfd = os.pidfd_open(keeper)
            asyncio.get_running_loop().add_reader(self._pidfd, self._ended)
        except OSError:  # it ended already
            self._gone.set()

    def _ended(self) -> None:
        self._gone.set()
        self._close_pidfd()

    def _close_pidfd(self) -> None:
        if self._pidfd >= 0:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1

    def lost(self) -> str:
        if self.removed:
            return "removed"
        if not self._gone.is_set():
            return ""
        why = "its init exited"
        if cgroups.oom_killed(self.cgroups):
            why += " after the kernel killed a process for the memory limit"
        return why

    async def _run(self, command: Command) -> ExecResult:
        request = {
            "argv": command.argv,
            "env": self.command_env(command.env),
            "cwd": command.cwd or self.image.workdir or "/",
            "user": command.user or self.image.user or "root",
        }
        return await exec_in(self, request, command.stdin, command.timeout_s, command.output_limit)

    async def _untar(self, data: bytes, dest: str, timeout_s: float, before: str = "") -> None:
        """The machine's init extracts the stream itself (`_machine.py`'s `untar` request): no
        shell, mkdir or tar to start; `before` is a shell command of its own."""
        if before:
            ran = await self.exec(["/bin/sh", "-c", before], timeout_s=timeout_s, output_limit=4096, user="0")
            self._copied(ran, dest)
        request = {"untar": dest, "user": "root", "cwd": "/", "argv": [], "env": {}}
        self._copied(await exec_in(self, request, data, timeout_s, 4096), dest)

    async def relabel(self, labels: Labels) -> None:
        self.labels = labels
        await asyncio.to_thread(_relabel, self.folder / "label.json", labels)

    async def _delete(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.keeper, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await self._gone.wait()
        self._close_pidfd()
        await asyncio.to_thread(_delete, self.folder, self.cgroups)
        if self.uid_lease >= 0:  # its processes are gone with its pid namespace: the block is free
            os.close(self.uid_lease)
            self.uid_lease = -1


def _lost(machine: DaemonlessMachine, doing: str) -> MachineLost:
    why = machine.lost() or "its control socket stopped answering"
    return MachineLost(
        f"machine {machine.id} ({machine.labels.rollout}) was lost while {doing}: {why}",
        metadata={"machine": machine.id},
    )


async def exec_in(
    machine: DaemonlessMachine, request: dict[str, Any], stdin: bytes, timeout_s: float, output_limit: int
) -> ExecResult:
    """One command over the machine's control socket (one connection; `_machine.py`'s protocol)."""
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    pipes: list[int] = []
    try:
        try:
            await loop.sock_connect(sock, str(machine.folder / "ctl.sock"))
        except OSError:
            raise _lost(machine, "starting a command") from None
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pipes = [in_w, out_r, err_r]
        try:
            socket.send_fds(sock, [json.dumps(request).encode()], [in_r, out_w, err_w])
        except OSError:
            raise _lost(machine, "starting a command") from None
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        stdout, stderr = CappedOutput(output_limit), CappedOutput(output_limit)
        readers = [
            asyncio.ensure_future(_drain_fd(loop, out_r, stdout)),
            asyncio.ensure_future(_drain_fd(loop, err_r, stderr)),
        ]
        feeder = asyncio.ensure_future(_feed(loop, in_w, stdin))
        pipes = []  # each is closed by its reader or feeder now
        reply_reader, reply_writer = await asyncio.open_unix_connection(sock=sock)
        timed_out = False
        reply = b""
        try:
            async with asyncio.timeout(timeout_s):
                reply = await reply_reader.readline()
        except TimeoutError:
            timed_out = True
        finally:
            reply_writer.close()  # before the reply: pid 1 kills the command's process group
        # The output ends with the command, unless it left something running that holds its pipes.
        await asyncio.wait(readers, timeout=2.0)
        for task in (*readers, feeder):
            task.cancel()
        await asyncio.gather(*readers, feeder, return_exceptions=True)
        seconds = time.monotonic() - began
        if timed_out:
            return _result(-1, stdout, stderr, seconds, timed_out=True)
        if not reply:
            raise _lost(machine, "running a command")
        answer = json.loads(reply)
        if "error" in answer:
            return _result(127, stdout, stderr, seconds, error=str(answer["error"]))
        return _result(int(answer["exit"]), stdout, stderr, seconds)
    finally:
        for fd in pipes:
            os.close(fd)
        sock.close()


def _result(
    code: int,
    stdout: CappedOutput,
    stderr: CappedOutput,
    seconds: float,
    *,
    timed_out: bool = False,
    error: str = "",
) -> ExecResult:
    err = stderr.value() + (error.encode() if error else b"")
    return ExecResult(
        code,
        stdout.value(),
        err,
        timed_out=timed_out,
        truncated=stdout.truncated or stderr.truncated,
        seconds=seconds,
    )


async def _drain_fd(loop: asyncio.AbstractEventLoop, fd: int, out: CappedOutput) -> None:
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        await drain(reader, out)
    finally:
        transport.close()


async def _feed(loop: asyncio.AbstractEventLoop, fd: int, data: bytes) -> None:
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(fd, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    try:
        if data:
            writer.write(data)
            await writer.drain()
    finally:
        transport.close()


class DaemonlessProvider(Provider):
    name = "daemonless"
    relabels = True

    def __init__(self, machines_dir: Path | None = None) -> None:
        super().__init__()
        self.machines_dir = machines_dir or MACHINES_DIR
        # Read once, here: a value that is not a boolean fails the environment's load, not the first
        # rollout's machine.
        self.user_namespaces = user_namespaces()
        self._builds: dict[str, asyncio.Lock] = {}
        self._owner = owner_identity()
        self._factory = _Factory()

    def problem(self) -> str:
        if os.geteuid() != 0:
            return "the daemonless provider needs root (mounts and namespaces)"
        try:
            with open("/proc/filesystems") as f:
                if "overlay" not in f.read():
                    return "the daemonless provider needs overlayfs, which this kernel does not offer"
        except OSError:
            return "no /proc/filesystems: not Linux"
        return ""

    def limits_offered(self) -> list[str]:
        return cgroups.available()

    # -- images --------------------------------------------------------------------------------------

    async def prepare(self, recipe: Recipe, *, timeout_s: float, where: str) -> Image:
        problem = self.problem()
        if problem:
            raise ProviderUnavailable(problem)
        if recipe.services:
            names = ", ".join(s.name for s in recipe.services)
            raise ServicesUnsupported(
                f"{where}: its compose file runs services besides `main` ({names}): the daemonless "
                "provider runs the main service alone; the Docker provider runs them beside it"
            )
        if not bases.is_local_base(recipe.base):
            raise ImageBuildFailed(
                f"{where}: base image {recipe.base!r} is not a local base: the daemonless provider builds "
                f"from {bases.PREFIX}<suite> (debootstrap); map it with the image map "
                f"(e.g. {recipe.base}={bases.PREFIX}bookworm)"
            )
        base = await asyncio.to_thread(bases.rootfs, recipe.base)
        digest = recipe.digest(f"{recipe.base}@{base}")
        if not recipe.steps:
            return Image(id=digest, env=dict(recipe.environment), layers=(str(base),))
        lock = self._builds.setdefault(digest, asyncio.Lock())
        async with lock:
            try:
                async with asyncio.timeout(timeout_s):
                    return await self._build(recipe, digest, base, where)
            except TimeoutError:
                raise ImageBuildTimeout(
                    f"{where}: the image build overran its timeout of {timeout_s:g}s",
                    metadata={"image": digest},
                ) from None

    async def _build(self, recipe: Recipe, digest: str, base: Path, where: str) -> Image:
        folder = images_dir() / digest
        if (folder / "ready").is_file():
            return _read_image(folder, base)
        images_dir().mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(images_dir() / f"{digest}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:  # another process may build the same image: wait for it, never twice
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    await asyncio.sleep(0.2)
            if (folder / "ready").is_file():
                return _read_image(folder, base)
            staging = images_dir() / f"{digest}.build-{os.getpid()}"
            await asyncio.to_thread(shutil.rmtree, staging, True)
            (staging / "diff").mkdir(parents=True)
            try:
                config = await self._run_steps(recipe, staging, base, where)
                await asyncio.to_thread(shutil.rmtree, staging / "work", True)
                (staging / "image.json").write_text(json.dumps(config))
                await asyncio.to_thread(shutil.rmtree, folder, True)
                staging.rename(folder)
                (folder / "ready").write_text(digest + "\n")
            finally:
                await asyncio.to_thread(shutil.rmtree, staging, True)
            log.info("container_image_built", image=digest, where=where)
            return _read_image(folder, base)
        finally:
            os.close(lock_fd)

    async def _run_steps(self, recipe: Recipe, staging: Path, base: Path, where: str) -> dict[str, Any]:
        env: dict[str, str] = dict(recipe.environment)
        args: dict[str, str] = {}
        workdir, user, shell = "/", "", ["/bin/sh", "-c"]
        scratch = Image(id="build", layers=(str(base),))
        machine = await self._spawn(
            scratch,
            Limits(allow_internet=True),
            Labels(job="build", rollout=staging.name, task=where),
            upper=str(staging / "diff"),
        )
        try:
            for step in recipe.steps:
                what = f"{where}: Dockerfile line {step.line} ({step.keyword})"
                if step.keyword == "RUN":
                    argv = list(step.args) if step.json_form else [*shell, step.args[0]]
                    result = await machine.exec(
                        argv,
                        timeout_s=24 * 3600,
                        output_limit=8192,
                        user=user,
                        cwd=workdir,
                        env={**args, **env},
                    )
                    if result.exit_code != 0:
                        tail = (
                            (result.stdout + result.stderr).decode(errors="replace").strip().splitlines()[-3:]
                        )
                        raise ImageBuildFailed(
                            f"{what} exited {result.exit_code}: {' | '.join(tail)[-400:]}",
                            metadata={"line": str(step.line)},
                        )
                elif step.keyword in ("COPY", "ADD"):
                    await _copy(machine, step, recipe.context, workdir, what)
                elif step.keyword == "ENV":
                    env.update(key_values(step.args[0]))
                elif step.keyword == "ARG":
                    for key, value in key_values(step.args[0]):
                        args.setdefault(key, value)
                elif step.keyword == "WORKDIR":
                    workdir = str(PurePosixPath(workdir, _expand(step.args[0], {**args, **env})))
                    await machine.exec(["mkdir", "-p", workdir], timeout_s=60, output_limit=1024, user="0")
                elif step.keyword == "USER":
                    user = _expand(step.args[0], {**args, **env})
                elif step.keyword in _IGNORED:
                    continue
                else:
                    raise ImageBuildFailed(f"{what}: the daemonless provider does not support {step.keyword}")
        finally:
            await machine.remove()
        return {"env": env, "workdir": workdir, "user": user}

    # -- machines ------------------------------------------------------------------------------------

    async def start(self, image: Image, limits: Limits, labels: Labels) -> Machine:
        return await self._spawn(image, limits, labels, upper=None)

    async def _spawn(
        self, image: Image, limits: Limits, labels: Labels, *, upper: str | None
    ) -> DaemonlessMachine:
        problem = self.problem()
        if problem:
            raise ProviderUnavailable(problem)
        # A rollout's machine gets a user namespace of its own: its uids 0-65535 are a block of
        # host uids leased for its lifetime (an image build runs as the host's root, as docker build).
        uid_base, uid_lease = (
            (None, -1) if upper is not None or not self.user_namespaces else lease_uid_block()
        )
        try:
            return await self._spawn_with(image, limits, labels, upper, uid_base, uid_lease)
        except BaseException:
            if uid_lease >= 0:
                os.close(uid_lease)
            raise

    async def _spawn_with(
        self,
        image: Image,
        limits: Limits,
        labels: Labels,
        upper: str | None,
        uid_base: int | None,
        uid_lease: int,
    ) -> DaemonlessMachine:
        machine_id = "rm-" + secrets.token_hex(6)
        folder = self.machines_dir / machine_id
        folder.mkdir(parents=True, mode=0o700)
        record = {
            "id": machine_id,
            "provider": self.name,
            "job": labels.job,
            "rollout": labels.rollout,
            "environment": labels.environment,
            "task": labels.task,
            "owner_pid": self._owner[0],
            "owner_start": self._owner[1],
            "started": time.time(),
        }
        try:
            folders = await asyncio.to_thread(cgroups.create, machine_id, limits)
        except OSError as exc:
            await asyncio.to_thread(_delete, folder, cgroups.machine_folders(machine_id))
            raise MachineStartFailed(f"machine {machine_id}: cgroup: {exc}") from None
        record["cgroups"] = folders
        (folder / "label.json").write_text(json.dumps(record))
        ready_r, ready_w = os.pipe()
        log_fd = os.open(folder / "machine.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        spec = {
            "parent": os.getpid(),
            "dir": str(folder),
            "lower": list(image.layers),
            "upper": upper,
            "storage_mb": limits.storage_mb or DEFAULT_STORAGE_MB,
            "network": limits.allow_internet,
            "cgroups": folders,
            "hostname": machine_id,
            "ready_fd": ready_w,
            "uid_base": uid_base,
        }
        try:
            keeper = await self._factory.fork(spec, ready_w, log_fd)
        except (OSError, TimeoutError) as exc:
            os.close(ready_r)
            await asyncio.to_thread(_delete, folder, folders)
            raise MachineStartFailed(f"machine {machine_id}: the factory did not fork it: {exc}") from None
        finally:
            os.close(ready_w)
            os.close(log_fd)
        record["keeper_pid"] = keeper
        record["keeper_start"] = process_start(keeper)
        record["uid_base"] = uid_base
        (folder / "label.json").write_text(json.dumps(record))
        machine = DaemonlessMachine(machine_id, labels, image, folder, keeper, folders, uid_lease)
        try:
            line = await _ready_line(ready_r)
        finally:
            os.close(ready_r)
        if line != "ready":
            machine.uid_lease = -1  # the caller frees the lease
            await machine.remove()
            log_text = _tail(folder / "machine.log")
            raise MachineStartFailed(
                f"machine {machine_id} did not start: {line or 'no answer'}{log_text}",
                metadata={"machine": machine_id},
            )
        if upper is None:
            self.machines[machine_id] = machine
        return machine

    async def sweep(self) -> int:
        swept = await asyncio.to_thread(sweep, self.machines_dir)
        if swept:
            log.info("container_machines_swept", provider=self.name, count=swept)
        return swept

    async def aclose(self) -> None:
        await super().aclose()
        await self._factory.aclose()


class _Factory:
    """`_machine.py --factory`: one process that forks every machine (a machine costs a fork, not an
    interpreter's start and imports: ~20 ms of CPU less each). Started on first use, again if it
    died; it dies with this process, and its machines with it."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    async def _start(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.returncode is None:
            return self._sock
        await self.aclose()
        ours, theirs = socket.socketpair()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-S",
                str(RUNNER),
                "--factory",
                str(os.getpid()),
                str(theirs.fileno()),
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        return ours

    async def fork(self, spec: dict[str, Any], ready_fd: int, log_fd: int) -> int:
        """The pid of a new machine (its keeper), forked with `spec`, its ready pipe and its log."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            sock = await self._start()
            socket.send_fds(sock, [json.dumps(spec).encode()], [ready_fd, log_fd])
            answer = b""
            async with asyncio.timeout(START_TIMEOUT_S):
                while not answer.endswith(b"\n"):
                    chunk = await loop.sock_recv(sock, 64)
                    if not chunk:
                        raise OSError("the machine factory exited")
                    answer += chunk
            return int(answer)

    async def aclose(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()
            self._proc = None


async def _ready_line(fd: int) -> str:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(fd), "rb", buffering=0)
    )
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            return (await reader.readline()).decode(errors="replace").strip()
    except TimeoutError:
        return f"no answer within {START_TIMEOUT_S:g}s"
    finally:
        transport.close()


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return f" ({text.splitlines()[-1][:300]})" if text else ""


async def _copy(machine: Machine, step: Instruction, context: Path | None, workdir: str, what: str) -> None:
    if "from" in step.flags:
        raise ImageBuildFailed(
            f"{what}: COPY --from (multi-stage) is not supported by the daemonless provider"
        )
    if context is None or len(step.args) < 2:
        raise ImageBuildFailed(f"{what}: needs a source and a destination")
    dest = step.args[-1]
    dest_abs = str(PurePosixPath(workdir, dest))
    targets = []
    for real, target in await asyncio.to_thread(_copy_sources, step, context, dest_abs, what):
        if real.is_dir():
            await machine.put_tree(real, target)
        else:
            data, mode = await asyncio.to_thread(_read_with_mode, real)
            await machine.put_file(target, data, mode=mode)
        targets.append(target)
    owner = step.flags.get("chown")
    if owner and targets:  # what this step copied, not the folder it copied into (as Docker)
        await machine.exec(["chown", "-R", owner, *targets], timeout_s=120, output_limit=1024, user="0")


def _read_with_mode(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mode & 0o777


def _copy_sources(step: Instruction, context: Path, dest_abs: str, what: str) -> list[tuple[Path, str]]:
    """Each source of a COPY/ADD (globs expanded) inside the context, with where it goes. Blocking."""
    *sources, dest = step.args
    into_folder = dest.endswith("/") or len(sources) > 1
    out: list[tuple[Path, str]] = []
    for source in sources:
        if "://" in source:
            raise ImageBuildFailed(f"{what}: {step.keyword} from a URL is not supported")
        matches = sorted(context.glob(source)) if any(ch in source for ch in "*?[") else [context / source]
        for found in matches:
            real = found.resolve()
            if not real.is_relative_to(context.resolve()) or not real.exists():
                raise ImageBuildFailed(f"{what}: {source!r} is not a file or folder of the build context")
            if step.keyword == "ADD" and real.is_file() and real.name.endswith(_ARCHIVES):
                raise ImageBuildFailed(f"{what}: ADD of an archive (which Docker unpacks) is not supported")
            target = dest_abs + "/" + real.name if real.is_file() and into_folder else dest_abs
            out.append((real, target))
    return out


def _expand(text: str, env: Mapping[str, str]) -> str:
    out = text
    for key, value in sorted(env.items(), key=lambda kv: -len(kv[0])):
        out = out.replace("${" + key + "}", value).replace("$" + key, value)
    return out.strip()


def _read_image(folder: Path, base: Path) -> Image:
    config = json.loads((folder / "image.json").read_text())
    return Image(
        id=folder.name,
        env=dict(config.get("env", {})),
        workdir=str(config.get("workdir") or "/"),
        user=str(config.get("user") or ""),
        layers=(str(folder / "diff"), str(base)),
    )


def _relabel(path: Path, labels: Labels) -> None:
    record = json.loads(path.read_text())
    record.update(job=labels.job, rollout=labels.rollout, environment=labels.environment, task=labels.task)
    staged = path.with_suffix(".new")
    staged.write_text(json.dumps(record))
    staged.replace(path)


def _delete(folder: Path, cgroup_folders: list[str]) -> None:
    cgroups.kill_and_remove(cgroup_folders)
    shutil.rmtree(folder, ignore_errors=True)


def sweep(machines_dir: Path) -> int:
    """Remove every machine whose owner is gone (its keeper killed, its cgroups and folder removed),
    and cgroup folders no machine folder claims. Blocking."""
    removed = 0
    known: set[str] = set()
    if machines_dir.is_dir():
        for folder in machines_dir.iterdir():
            known.add(folder.name)
            try:
                record = json.loads((folder / "label.json").read_text())
            except (OSError, ValueError):
                record = {}
            owner = int(record.get("owner_pid", 0)), int(record.get("owner_start", 0))
            if record and process_alive(*owner):
                continue
            if not record and time.time() - folder.stat().st_mtime < 60:
                continue  # being made right now
            keeper = int(record.get("keeper_pid", 0)), int(record.get("keeper_start", 0))
            if process_alive(*keeper):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(keeper[0], signal.SIGKILL)
            folders = list(record.get("cgroups") or cgroups.machine_folders(folder.name))
            _delete(folder, folders)
            removed += 1
            log.info(
                "container_machine_swept",
                machine=folder.name,
                job=record.get("job"),
                rollout=record.get("rollout"),
            )
    for base in _cgroup_parents():
        for leftover in base.iterdir() if base.is_dir() else ():
            if leftover.is_dir() and leftover.name.startswith("rm-") and leftover.name not in known:
                cgroups.kill_and_remove([str(leftover)])
    return removed


def _cgroup_parents() -> list[Path]:
    found = cgroups.layout()
    bases_ = [found.unified] if found.unified is not None else list(found.v1.values())
    return [b / cgroups.PARENT for b in bases_]
