"""The Docker provider: machines are containers of a Docker daemon (DOCKER_HOST, else the default
socket; `deploy/local-docker.sh` makes a private one where there is none), driven through the
`docker` CLI.

Images: a recipe without steps runs its (mapped) base as it is (pulled when missing: a daemon that
reaches no registry needs the image map); one with steps is built once per content digest as
`rollmesh-task:<digest>` from a Dockerfile rewritten with the mapped base, in the task's build
context, under the build timeout. Machines: `docker run -d` of the image with `sleep infinity` as
its command, the task's memory (no swap beyond it), CPUs, 4096 processes and, unless the task allows
the internet, `--network none` (with it, the host's network: a private daemon made by
local-docker.sh has no bridge); labels `rollmesh.machine`, `rollmesh.job`, `rollmesh.rollout`,
`rollmesh.environment`, `rollmesh.task` and `rollmesh.owner` (host:pid:start of the verifier).
A command is `docker exec` under coreutils' `timeout` in the container (so a cut command dies in
the container, not only its client). `sweep()` removes the labelled containers whose owner on this
host is gone. Disk size (`storage_mb`) is not enforced: Docker's overlay2 needs an XFS backing
store with project quotas for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rollmesh.mesh.children import kill_group
from rollmesh.mesh.logging import get_logger
from rollmesh.verifier.bridges.container.errors import (
    ImageBuildFailed,
    ImageBuildTimeout,
    MachineLost,
    MachineStartFailed,
    ProviderUnavailable,
)
from rollmesh.verifier.bridges.container.images import Instruction, Recipe
from rollmesh.verifier.bridges.container.provider import (
    CappedOutput,
    ExecResult,
    Image,
    Labels,
    Machine,
    Provider,
    drain,
    owner_identity,
    process_alive,
)
from rollmesh.verifier.bridges.container.task import Limits

log = get_logger("rollmesh.verifier.container.docker")

LABEL = "rollmesh.machine"
IMAGE_PREFIX = "rollmesh-task"
DEFAULT_PIDS = 4096
_GONE = ("No such container", "is not running", "cannot exec in a stopped", "is paused")


async def docker(
    *args: str, stdin: bytes = b"", timeout_s: float = 120.0, limit: int = 1 << 20
) -> ExecResult:
    """`docker ARGS...` (its output capped); exit -1 and `timed_out` when cut at `timeout_s`."""
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "docker",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    out, err = CappedOutput(limit), CappedOutput(limit)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            if stdin:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()

    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(feed(), drain(proc.stdout, out), drain(proc.stderr, err))
            code = await proc.wait()
    except TimeoutError:
        kill_group(proc)
        await proc.wait()
        return ExecResult(-1, out.value(), err.value(), timed_out=True, seconds=time.monotonic() - began)
    return ExecResult(
        code,
        out.value(),
        err.value(),
        truncated=out.truncated or err.truncated,
        seconds=time.monotonic() - began,
    )


_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _tail(result: ExecResult, lines: int = 3) -> str:
    text = _ESCAPES.sub("", (result.stderr or result.stdout).decode(errors="replace")).strip().splitlines()
    return " | ".join(text[-lines:])[-500:]


class DockerMachine(Machine):
    def __init__(self, container: str, labels: Labels, image: Image) -> None:
        super().__init__(container[:12], labels, image)
        self.container = container
        self._lost = ""

    def lost(self) -> str:
        return "removed" if self.removed else self._lost

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
        if self._lost:
            raise MachineLost(f"machine {self.id} ({self.labels.rollout}) is gone: {self._lost}")
        args = ["exec", "-i"]
        if user:
            args += ["-u", user]
        if cwd:
            args += ["-w", cwd]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        # `timeout` in the container: a cut command dies there, not only its docker client.
        limit = max(1, int(timeout_s + 0.999))
        args += [self.container, "timeout", "-s", "KILL", str(limit), *argv]
        result = await docker(*args, stdin=stdin, timeout_s=timeout_s + 30, limit=output_limit)
        if result.exit_code in (125, 126, 127) or result.timed_out:
            said = result.stderr.decode(errors="replace")
            if any(word in said for word in _GONE):
                self._lost = said.strip().splitlines()[-1][:300]
                raise MachineLost(f"machine {self.id} ({self.labels.rollout}) was lost: {self._lost}")
        if result.exit_code == 137 and result.seconds >= limit:  # `timeout` killed it
            return ExecResult(-1, result.stdout, result.stderr, timed_out=True, seconds=result.seconds)
        return result

    async def _delete(self) -> None:
        await docker("rm", "-f", "-v", self.container, timeout_s=300)


class DockerProvider(Provider):
    name = "docker"

    def __init__(self) -> None:
        super().__init__()
        self._builds: dict[str, asyncio.Lock] = {}
        self._problem = "not probed yet: the environment has not started"
        pid, start = owner_identity()
        self._owner = f"{socket.gethostname()}:{pid}:{start}"

    def problem(self) -> str:
        return self._problem

    async def open(self) -> None:
        if shutil.which("docker") is None:
            self._problem = "the docker CLI is not installed (deploy/local-docker.sh installs and starts one)"
            return
        info = await docker("info", "--format", "{{.ServerVersion}}", timeout_s=30)
        if info.exit_code != 0:
            where = os.environ.get("DOCKER_HOST") or "the default socket"
            self._problem = f"no Docker daemon answers at {where}: {_tail(info, 1)}"
            return
        self._problem = ""
        await self.sweep()

    async def prepare(self, recipe: Recipe, *, timeout_s: float, where: str) -> Image:
        if self._problem:
            raise ProviderUnavailable(self._problem)
        if not recipe.steps:
            await self._ensure_base(recipe.base, where, timeout_s)
            return await self._inspect(recipe.base, recipe.environment)
        digest = recipe.digest(recipe.base)
        tag = f"{IMAGE_PREFIX}:{digest}"
        async with self._builds.setdefault(digest, asyncio.Lock()):
            found = await docker("image", "inspect", tag, timeout_s=60)
            if found.exit_code != 0:
                await self._build(recipe, tag, where, timeout_s)
        return await self._inspect(tag, recipe.environment)

    async def _ensure_base(self, image: str, where: str, timeout_s: float) -> None:
        if (await docker("image", "inspect", image, timeout_s=60)).exit_code == 0:
            return
        pulled = await docker("pull", "-q", image, timeout_s=timeout_s)
        if pulled.exit_code != 0:
            raise ImageBuildFailed(
                f"{where}: image {image!r} is not on the daemon and cannot be pulled ({_tail(pulled, 1)}); "
                "map it to one that is with the image map"
            )

    async def _build(self, recipe: Recipe, tag: str, where: str, timeout_s: float) -> None:
        await self._ensure_base(recipe.base, where, timeout_s)
        lines = [f"FROM {recipe.base}", *(_line(step) for step in recipe.steps)]
        # The host's network for RUN steps (apt-get): a private daemon made by local-docker.sh has no bridge.
        args = [
            "build",
            "-q",
            "--force-rm",
            "--network",
            "host",
            "-t",
            tag,
            "--label",
            f"{LABEL}.image=1",
            "-f",
            "-",
        ]
        args.append(str(recipe.context) if recipe.context is not None else ".")
        result = await docker(*args, stdin="\n".join(lines).encode() + b"\n", timeout_s=timeout_s)
        if result.timed_out:
            raise ImageBuildTimeout(f"{where}: the image build overran its timeout of {timeout_s:g}s")
        if result.exit_code != 0:
            raise ImageBuildFailed(f"{where}: docker build failed: {_tail(result)}")
        log.info("container_image_built", image=tag, where=where)

    async def _inspect(self, image: str, extra_env: Mapping[str, str]) -> Image:
        found = await docker("image", "inspect", "--format", "{{json .Config}}", image, timeout_s=60)
        if found.exit_code != 0:
            raise ImageBuildFailed(f"image {image!r}: {_tail(found, 1)}")
        config: dict[str, Any] = json.loads(found.stdout) or {}
        env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
        env.update(extra_env)
        return Image(
            id=image,
            env=env,
            workdir=str(config.get("WorkingDir") or "/"),
            user=str(config.get("User") or ""),
            ref=image,
        )

    async def start(self, image: Image, limits: Limits, labels: Labels) -> Machine:
        if self._problem:
            raise ProviderUnavailable(self._problem)
        name = "rm-" + secrets.token_hex(6)
        args = ["run", "-d", "--name", name, "--hostname", name, "--pids-limit", str(DEFAULT_PIDS)]
        tags = {
            LABEL: "1",
            f"{LABEL}.job": labels.job,
            f"{LABEL}.rollout": labels.rollout,
            f"{LABEL}.environment": labels.environment,
            f"{LABEL}.task": labels.task,
            f"{LABEL}.owner": self._owner,
        }
        for key, value in tags.items():
            args += ["--label", f"{key}={value}"]
        args += ["--network", "host" if limits.allow_internet else "none"]
        if limits.memory_mb:
            args += ["--memory", f"{limits.memory_mb}m", "--memory-swap", f"{limits.memory_mb}m"]
        if limits.cpus:
            args += ["--cpus", f"{limits.cpus:g}"]
        for key, value in image.env.items():
            args += ["-e", f"{key}={value}"]
        args += ["--entrypoint", "sleep", image.ref or image.id, "infinity"]
        result = await docker(*args, timeout_s=120)
        if result.exit_code != 0:
            await docker("rm", "-f", name, timeout_s=60)
            raise MachineStartFailed(
                f"machine {name} did not start: {_tail(result)}", metadata={"machine": name}
            )
        machine = DockerMachine(result.stdout.decode().strip() or name, labels, image)
        self.machines[machine.id] = machine
        return machine

    async def sweep(self) -> int:
        """Remove the labelled containers whose owner (a verifier on this host) is gone."""
        listed = await docker(
            "ps",
            "-a",
            "--filter",
            f"label={LABEL}=1",
            "--format",
            f'{{{{.ID}}}} {{{{.Label "{LABEL}.owner"}}}}',
        )
        host = socket.gethostname()
        stale = []
        for line in listed.stdout.decode(errors="replace").splitlines():
            container, _, owner = line.partition(" ")
            owner_host, _, rest = owner.partition(":")
            pid, _, start = rest.partition(":")
            if owner_host != host or not pid.isdigit() or not start.isdigit():
                continue
            if not process_alive(int(pid), int(start)):
                stale.append(container)
        if stale:
            await docker("rm", "-f", "-v", *stale, timeout_s=300)
            log.info("container_machines_swept", provider=self.name, count=len(stale))
        return len(stale)


def _line(step: Instruction) -> str:
    """One instruction as a Dockerfile line again (COPY/ADD and JSON forms as JSON arrays)."""
    flags = " ".join(f"--{k}={v}" if v else f"--{k}" for k, v in step.flags.items())
    head = f"{step.keyword} {flags}".strip()
    if step.json_form or step.keyword in ("COPY", "ADD"):
        return f"{head} {json.dumps(list(step.args))}"
    return f"{head} {step.args[0]}"
