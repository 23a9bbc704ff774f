"""The Docker provider: machines are containers of a Docker daemon (DOCKER_HOST, else the default
socket; `deploy/local-docker.sh` makes a private one where there is none), driven through the
Engine API over its socket (docker_api.py), not the `docker` CLI.

Images: a recipe without steps runs its (mapped) base as it is (pulled when missing: a daemon that
reaches no registry needs the image map); one with steps is built once per content digest as
`rollmesh-task:<digest>` from a Dockerfile rewritten with the mapped base, in the task's build
context (sent as a tar; `.dockerignore` is not read), with the host's network, under the build
timeout. Machines: a container of the image with `sleep infinity` as its command, the task's memory
(no swap beyond it), CPUs, 4096 processes and, unless the task allows the internet, no network
(with it, the host's network: a private daemon made by local-docker.sh has no bridge); labels
`rollmesh.machine`, `rollmesh.job`, `rollmesh.rollout`, `rollmesh.environment`, `rollmesh.task` and
`rollmesh.owner` (host:pid:start of the verifier). A command is an exec under coreutils' `timeout`
in the container (so a cut command dies in the container, not only our wait); files go in through
the archive endpoint. `sweep()` removes the labelled containers whose owner on this host is gone.

What Docker cannot do here is refused by name: a task's `storage_mb` where the daemon's storage
driver has no per-container size (overlay2 needs XFS with project quotas), unless the environment
accepts it unenforced (`docker_storage = "unenforced"`); warm machines (a container's labels are
fixed when it is created, so a machine started ahead cannot become a rollout's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import secrets
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from rollmesh.mesh.logging import get_logger
from rollmesh.verifier.bridges.container.docker_api import DockerAPI
from rollmesh.verifier.bridges.container.docker_api import DockerAPIError
from rollmesh.verifier.bridges.container.docker_api import endpoint
from rollmesh.verifier.bridges.container.errors import ImageBuildFailed
from rollmesh.verifier.bridges.container.errors import ImageBuildTimeout
from rollmesh.verifier.bridges.container.errors import MachineLost
from rollmesh.verifier.bridges.container.errors import MachineStartFailed
from rollmesh.verifier.bridges.container.errors import ProviderUnavailable
from rollmesh.verifier.bridges.container.errors import StorageLimitUnsupported
from rollmesh.verifier.bridges.container.images import Instruction
from rollmesh.verifier.bridges.container.images import Recipe
from rollmesh.verifier.bridges.container.images import Service
from rollmesh.verifier.bridges.container.provider import Command
from rollmesh.verifier.bridges.container.provider import ExecResult
from rollmesh.verifier.bridges.container.provider import Image
from rollmesh.verifier.bridges.container.provider import Labels
from rollmesh.verifier.bridges.container.provider import Machine
from rollmesh.verifier.bridges.container.provider import Provider
from rollmesh.verifier.bridges.container.provider import owner_identity
from rollmesh.verifier.bridges.container.provider import process_alive
from rollmesh.verifier.bridges.container.provider import tar_of
from rollmesh.verifier.bridges.container.provider import tree_tar
from rollmesh.verifier.bridges.container.task import MAIN_SERVICE
from rollmesh.verifier.bridges.container.task import Limits

log = get_logger("rollmesh.verifier.container.docker")

LABEL = "rollmesh.machine"
IMAGE_PREFIX = "rollmesh-task"
DEFAULT_PIDS = 4096
#: The build context's Dockerfile (ours: the task's with its base mapped), beside the task's files.
BUILD_DOCKERFILE = ".rollmesh.Dockerfile"
#: Storage drivers that take a per-container size (`StorageOpt size`); overlay2 only on XFS + pquota.
_SIZED_DRIVERS = ("btrfs", "zfs", "devicemapper", "windowsfilter")
#: How long our wait for a command outlasts its own timeout (which `timeout` enforces in the machine).
_EXEC_SLACK_S = 30.0
_Failure = (DockerAPIError, aiohttp.ClientError, OSError)


class DockerMachine(Machine):
    def __init__(
        self,
        container: str,
        labels: Labels,
        image: Image,
        api: DockerAPI,
        *,
        services: list[str] | None = None,
        network: str = "",
    ) -> None:
        super().__init__(container, labels, image)
        self.container = container
        self.api = api
        #: The containers of its compose services besides `main`, and their private network.
        self.services = services or []
        self.network = network
        self._lost = ""

    def lost(self) -> str:
        return "removed" if self.removed else self._lost

    def _gone(self, doing: str, exc: BaseException) -> MachineLost:
        said = str(exc) or type(exc).__name__
        why = exc.message if isinstance(exc, DockerAPIError) else f"the daemon stopped answering ({said})"
        self._lost = self._lost or why[:300]
        return MachineLost(
            f"machine {self.id} ({self.labels.rollout}) was lost while {doing}: {self._lost}",
            metadata={"machine": self.id},
        )

    async def _run(self, command: Command) -> ExecResult:
        if self._lost:
            raise MachineLost(f"machine {self.id} ({self.labels.rollout}) is gone: {self._lost}")
        # `timeout` in the container: a cut command dies there, not only our wait for it.
        limit = max(1, int(command.timeout_s + 0.999))
        try:
            ended = await self.api.exec(
                self.container,
                ["timeout", "-s", "KILL", str(limit), *command.argv],
                stdin=command.stdin,
                user=command.user or self.image.user,
                cwd=command.cwd or self.image.workdir,
                env={**self.image.env, **command.env},
                output_limit=command.output_limit,
                timeout_s=command.timeout_s + _EXEC_SLACK_S,
            )
        except (*_Failure, TimeoutError) as exc:  # 404: no such container, 409: it is not running
            raise self._gone("running a command", exc) from None
        stdout, stderr = ended.stdout.value(), ended.stderr.value()
        truncated = ended.stdout.truncated or ended.stderr.truncated
        seconds = ended.seconds
        if ended.timed_out or ended.exit_code is None:
            await self._check_alive()  # MachineLost when its container is gone
            if not ended.timed_out:
                raise self._gone("running a command", DockerAPIError(500, "the daemon recorded no exit code"))
            return ExecResult(-1, stdout, stderr, timed_out=True, truncated=truncated, seconds=seconds)
        if ended.exit_code == 137 and seconds >= limit:  # `timeout` killed it
            return ExecResult(-1, stdout, stderr, timed_out=True, truncated=truncated, seconds=seconds)
        return ExecResult(ended.exit_code, stdout, stderr, truncated=truncated, seconds=seconds)

    async def _check_alive(self) -> None:
        """Raise MachineLost when the container is no longer running."""
        try:
            state = await self.api.call("GET", f"/containers/{self.container}/json", timeout_s=30)
        except (*_Failure, TimeoutError) as exc:
            raise self._gone("running a command", exc) from None
        if not (state.get("State") or {}).get("Running"):
            raise self._gone("running a command", DockerAPIError(409, "its container stopped"))

    async def put_tree(self, source: Path, dest: str, *, before: str = "", timeout_s: float = 120.0) -> None:
        """The folder as `dest`'s last part, in one request to its parent (which exists: "/" for
        /tests and /solution), after `before` (a command of its own)."""
        parent, _, name = dest.rstrip("/").rpartition("/")
        if not name:
            return await super().put_tree(source, dest, before=before, timeout_s=timeout_s)
        data = await asyncio.to_thread(tree_tar, source, root=name)
        await self._untar(data, parent or "/", timeout_s, before)

    async def _untar(self, data: bytes, dest: str, timeout_s: float, before: str = "") -> None:
        """Through the archive endpoint (after `before`, and with `dest` made, in one command)."""
        if before:
            await self._prepare_dest(dest, timeout_s, before)
        try:
            await self._put_archive(data, dest, timeout_s)
        except DockerAPIError as exc:
            if exc.status != 404 or before or exc.message.startswith("No such container"):
                raise self._gone(f"copying files into {dest}", exc) from None
            await self._prepare_dest(dest, timeout_s)  # the folder is missing: make it, once
            try:
                await self._put_archive(data, dest, timeout_s)
            except (*_Failure, TimeoutError) as again:
                raise self._gone(f"copying files into {dest}", again) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise self._gone(f"copying files into {dest}", exc) from None

    async def _put_archive(self, data: bytes, dest: str, timeout_s: float) -> None:
        await self.api.call(
            "PUT",
            f"/containers/{self.container}/archive",
            params={"path": dest},
            data=data,
            content_type="application/x-tar",
            timeout_s=timeout_s,
        )

    async def _prepare_dest(self, dest: str, timeout_s: float, before: str = "") -> None:
        result = await self.exec(
            ["/bin/sh", "-c", before + 'mkdir -p "$1"', "put", dest],
            timeout_s=timeout_s,
            output_limit=4096,
            user="0",
        )
        self._copied(result, dest)

    async def _delete(self) -> None:
        await _remove_all(self.api, [self.container, *self.services], self.network)


class DockerProvider(Provider):
    name = "docker"
    relabels_not = "a Docker container's labels are fixed when it is created"

    def __init__(self) -> None:
        super().__init__()
        self._builds: dict[str, asyncio.Lock] = {}
        self._problem = "not probed yet: the environment has not started"
        self._api: DockerAPI | None = None
        #: Whether the daemon's storage driver can cap a container's disk (`StorageOpt size`).
        self.sizes_storage = False
        #: Run tasks whose `storage_mb` the daemon cannot enforce (`docker_storage = "unenforced"`).
        self.storage_unenforced = False
        pid, start = owner_identity()
        self._owner = f"{socket.gethostname()}:{pid}:{start}"

    def problem(self) -> str:
        return self._problem

    @property
    def api(self) -> DockerAPI:
        if self._api is None or self._problem:
            raise ProviderUnavailable(self._problem or "the Docker provider has not been opened")
        return self._api

    async def open(self) -> None:
        try:
            where = endpoint()
        except ValueError as exc:
            self._problem = str(exc)
            return
        api = DockerAPI(where)
        try:
            await api.open()
            info = await api.call("GET", "/info", timeout_s=30)
        except (*_Failure, TimeoutError) as exc:
            await api.aclose()
            said = exc.message if isinstance(exc, DockerAPIError) else str(exc) or type(exc).__name__
            self._problem = (
                f"no Docker daemon answers at {where}: {said} (deploy/local-docker.sh starts a private one)"
            )
            return
        self._api, self._problem = api, ""
        self.sizes_storage = _sizes_storage(info)
        await self.sweep()

    async def aclose(self) -> None:
        await super().aclose()
        if self._api is not None:
            await self._api.aclose()

    async def prepare(self, recipe: Recipe, *, timeout_s: float, where: str) -> Image:
        if self._problem:
            raise ProviderUnavailable(self._problem)
        main, *others = await asyncio.gather(
            self._image_of(recipe, timeout_s, where),
            *(self._image_of(s.recipe, timeout_s, f"{where} (service {s.name})") for s in recipe.services),
        )
        return dataclasses.replace(main, services=tuple(zip(recipe.services, others, strict=True)))

    async def _image_of(self, recipe: Recipe, timeout_s: float, where: str) -> Image:
        if not recipe.steps:
            await self._ensure_base(recipe.base, where, timeout_s)
            return await self._inspect(recipe.base, recipe.environment)
        digest = recipe.digest(recipe.base)
        tag = f"{IMAGE_PREFIX}:{digest}"
        async with self._builds.setdefault(digest, asyncio.Lock()):
            if not await self._has_image(tag):
                await self._build(recipe, tag, where, timeout_s)
        return await self._inspect(tag, recipe.environment)

    async def _has_image(self, image: str) -> bool:
        try:
            await self.api.call("GET", f"/images/{quote(image, safe='')}/json", timeout_s=60)
        except DockerAPIError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def _ensure_base(self, image: str, where: str, timeout_s: float) -> None:
        if await self._has_image(image):
            return
        try:
            await self.api.progress("/images/create", params={"fromImage": image}, timeout_s=timeout_s)
        except (*_Failure, TimeoutError) as exc:
            said = exc.message if isinstance(exc, DockerAPIError) else str(exc) or type(exc).__name__
            raise ImageBuildFailed(
                f"{where}: image {image!r} is not on the daemon and cannot be pulled ({said}); "
                "map it to one that is with the image map"
            ) from None

    async def _build(self, recipe: Recipe, tag: str, where: str, timeout_s: float) -> None:
        await self._ensure_base(recipe.base, where, timeout_s)
        lines = [f"FROM {recipe.base}", *(_line(step) for step in recipe.steps)]
        dockerfile = {BUILD_DOCKERFILE: (("\n".join(lines) + "\n").encode(), 0o644)}
        context = await asyncio.to_thread(_context_tar, recipe.context, dockerfile)
        # The host's network for RUN steps (apt-get): a private daemon made by local-docker.sh has no bridge.
        params = {
            "t": tag,
            "q": "1",
            "forcerm": "1",
            "networkmode": "host",
            "dockerfile": BUILD_DOCKERFILE,
            "labels": json.dumps({f"{LABEL}.image": "1"}),
        }
        try:
            await self.api.progress("/build", params=params, data=context, timeout_s=timeout_s)
        except TimeoutError:
            raise ImageBuildTimeout(
                f"{where}: the image build overran its timeout of {timeout_s:g}s"
            ) from None
        except _Failure as exc:
            said = exc.message if isinstance(exc, DockerAPIError) else str(exc)
            raise ImageBuildFailed(f"{where}: the image build failed: {said[-500:]}") from None
        log.info("container_image_built", image=tag, where=where)

    async def _inspect(self, image: str, extra_env: Mapping[str, str]) -> Image:
        try:
            found = await self.api.call("GET", f"/images/{quote(image, safe='')}/json", timeout_s=60)
        except _Failure as exc:
            raise ImageBuildFailed(f"image {image!r}: {exc}") from None
        config: dict[str, Any] = found.get("Config") or {}
        env = dict(e.partition("=")[::2] for e in config.get("Env") or [])
        env.update(extra_env)
        return Image(
            id=image,
            env=env,
            workdir=str(config.get("WorkingDir") or "/"),
            user=str(config.get("User") or ""),
            ref=image,
        )

    def storage_refusal(self, limits: Limits) -> str:
        """Why a task's storage limit cannot run here ("" when it can: none, enforced, or accepted
        unenforced)."""
        if not limits.storage_mb or self.sizes_storage or self.storage_unenforced:
            return ""
        return (
            f"its storage limit ({limits.storage_mb} MB) cannot be enforced: the daemon's storage driver "
            "has no per-container size (overlay2 needs XFS with project quotas); "
            'docker_storage = "unenforced" in container_tasks.toml runs it without the limit'
        )

    async def start(self, image: Image, limits: Limits, labels: Labels) -> Machine:
        api = self.api
        refusal = self.storage_refusal(limits)
        if refusal:
            raise StorageLimitUnsupported(f"task {labels.task!r}: {refusal}", metadata={"task": labels.task})
        name = "rm-" + secrets.token_hex(6)
        tags = {
            LABEL: "1",
            f"{LABEL}.job": labels.job,
            f"{LABEL}.rollout": labels.rollout,
            f"{LABEL}.environment": labels.environment,
            f"{LABEL}.task": labels.task,
            f"{LABEL}.owner": self._owner,
        }
        host: dict[str, Any] = {
            "NetworkMode": "host" if limits.allow_internet else "none",
            "PidsLimit": DEFAULT_PIDS,
        }
        if limits.memory_mb:
            host["Memory"] = host["MemorySwap"] = limits.memory_mb << 20
        if limits.cpus:
            host["NanoCpus"] = int(limits.cpus * 1e9)
        if limits.storage_mb and self.sizes_storage:
            host["StorageOpt"] = {"size": f"{limits.storage_mb}m"}
        config: dict[str, Any] = {
            "Image": image.ref or image.id,
            "Hostname": name,
            "Entrypoint": ["sleep"],
            "Cmd": ["infinity"],
            "Env": [f"{k}={v}" for k, v in image.env.items()],
            "Labels": tags,
            "HostConfig": host,
        }
        made: list[str] = []  # the side services' containers, for removal with the machine
        network = name if image.services else ""
        try:
            if network:
                await api.call(
                    "POST",
                    "/networks/create",
                    body={"Name": network, "Internal": not limits.allow_internet, "Labels": tags},
                )
                _join(config, network, MAIN_SERVICE)
                for service, service_image in image.services:
                    made.append(f"{name}-{service.name}")
                    await self._create_and_start(
                        made[-1], _service_config(service, service_image, network, tags)
                    )
                await self._healthy(image, name)
            await self._create_and_start(name, config)
        except (*_Failure, TimeoutError, MachineStartFailed) as exc:
            await _remove_all(api, [name, *made], network)
            if isinstance(exc, MachineStartFailed):
                raise
            said = exc.message if isinstance(exc, DockerAPIError) else str(exc) or type(exc).__name__
            if "storage-opt" in said or "storage opt" in said.lower():
                raise StorageLimitUnsupported(
                    f"task {labels.task!r}: the daemon refused its storage limit: {said}",
                    metadata={"task": labels.task},
                ) from None
            raise MachineStartFailed(
                f"machine {name} did not start: {said}", metadata={"machine": name}
            ) from None
        machine = DockerMachine(name, labels, image, api, services=made, network=network)
        self.machines[machine.id] = machine
        return machine

    async def _create_and_start(self, name: str, config: Mapping[str, Any]) -> None:
        await self.api.call("POST", "/containers/create", params={"name": name}, body=config)
        await self.api.call("POST", f"/containers/{name}/start")

    async def _healthy(self, image: Image, name: str) -> None:
        """Wait until every side service with a healthcheck is healthy (MachineStartFailed when one
        turns unhealthy or stays starting past its checks' time)."""
        for service, _ in image.services:
            check = service.healthcheck
            if check is None:
                continue
            container = f"{name}-{service.name}"
            bound = check.start_period_s + (check.retries + 1) * (check.interval_s + check.timeout_s) + 30
            deadline = asyncio.get_running_loop().time() + min(bound, 900.0)
            why = f"was not healthy within {min(bound, 900.0):g}s"
            while asyncio.get_running_loop().time() < deadline:
                found = await self.api.call("GET", f"/containers/{container}/json", timeout_s=30)
                state = found.get("State") or {}
                status = str((state.get("Health") or {}).get("Status", "starting"))
                if status == "healthy":
                    why = ""
                    break
                if status == "unhealthy" or not state.get("Running"):
                    why = "failed its healthcheck" if status == "unhealthy" else "stopped"
                    break
                await asyncio.sleep(0.2)
            if why:
                raise MachineStartFailed(
                    f"machine {name}: service {service.name!r} {why}",
                    metadata={"machine": name, "service": service.name},
                )

    async def sweep(self) -> int:
        """Remove the labelled containers (and networks) whose owner (a verifier on this host) is
        gone; how many containers."""
        filters = {"filters": json.dumps({"label": [f"{LABEL}=1"]})}
        containers = await self.api.call("GET", "/containers/json", params={"all": "1", **filters})
        networks = await self.api.call("GET", "/networks", params=filters)
        stale = [str(c["Id"]) for c in containers or [] if self._orphan(c)]
        stale_networks = [str(n["Id"]) for n in networks or [] if self._orphan(n)]
        await _remove_all(self.api, stale, *stale_networks)
        if stale or stale_networks:
            log.info(
                "container_machines_swept", provider=self.name, count=len(stale), networks=len(stale_networks)
            )
        return len(stale)

    def _orphan(self, found: Mapping[str, Any]) -> bool:
        """Whether a labelled container or network belongs to a verifier on this host that is gone."""
        owner = str((found.get("Labels") or {}).get(f"{LABEL}.owner", ""))
        owner_host, _, rest = owner.partition(":")
        pid, _, start = rest.partition(":")
        if owner_host != socket.gethostname() or not pid.isdigit() or not start.isdigit():
            return False
        return not process_alive(int(pid), int(start))


async def _remove_all(api: DockerAPI, containers: list[str], *networks: str) -> None:
    """Remove the containers (with their volumes), then the networks; what is already gone is fine."""

    async def remove(path: str, params: Mapping[str, str]) -> None:
        with contextlib.suppress(*_Failure, TimeoutError):
            await api.call("DELETE", path, params=params, timeout_s=300)

    await asyncio.gather(*(remove(f"/containers/{c}", {"force": "1", "v": "1"}) for c in containers))
    await asyncio.gather(*(remove(f"/networks/{n}", {}) for n in networks if n))


def _join(config: dict[str, Any], network: str, alias: str) -> None:
    """Put a container on the machine's private network, reachable there by `alias`."""
    config["HostConfig"]["NetworkMode"] = network
    config["NetworkingConfig"] = {"EndpointsConfig": {network: {"Aliases": [alias]}}}


def _service_config(service: Service, image: Image, network: str, tags: Mapping[str, str]) -> dict[str, Any]:
    """A side service's container: its image, command, variables and healthcheck, on the network."""
    config: dict[str, Any] = {
        "Image": image.ref or image.id,
        "Hostname": service.name,
        "Env": [f"{k}={v}" for k, v in image.env.items()],
        "Labels": {**tags, f"{LABEL}.service": service.name},
        "HostConfig": {"PidsLimit": DEFAULT_PIDS},
    }
    if service.command is not None:
        config["Cmd"] = list(service.command)
    if service.entrypoint is not None:
        config["Entrypoint"] = list(service.entrypoint)
    check = service.healthcheck
    if check is not None:
        config["Healthcheck"] = {
            "Test": list(check.test),
            "Interval": int(check.interval_s * 1e9),
            "Timeout": int(check.timeout_s * 1e9),
            "Retries": check.retries,
            "StartPeriod": int(check.start_period_s * 1e9),
        }
    _join(config, network, service.name)
    return config


def _sizes_storage(info: Mapping[str, Any]) -> bool:
    """Whether the daemon's storage driver caps a container's disk (from GET /info)."""
    driver = str(info.get("Driver", ""))
    if driver in _SIZED_DRIVERS:
        return True
    status = {str(k): str(v) for k, v in info.get("DriverStatus") or []}
    return driver == "overlay2" and status.get("Backing Filesystem") == "xfs"


def _context_tar(context: Path | None, extra: Mapping[str, tuple[bytes, int]]) -> bytes:
    return tree_tar(context, extra) if context is not None else tar_of(extra)


def _line(step: Instruction) -> str:
    """One instruction as a Dockerfile line again (COPY/ADD and JSON forms as JSON arrays)."""
    flags = " ".join(f"--{k}={v}" if v else f"--{k}" for k, v in step.flags.items())
    head = f"{step.keyword} {flags}".strip()
    if step.json_form or step.keyword in ("COPY", "ADD"):
        return f"{head} {json.dumps(list(step.args))}"
    return f"{head} {step.args[0]}"
