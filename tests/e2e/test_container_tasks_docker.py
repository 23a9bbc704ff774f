"""The container-task environment on the Docker provider (`make test-containers`: deploy/local-docker.sh
makes a private daemon and the local base image `rollmesh-base:bookworm`; the tasks' bases are mapped
to it). The same Harbor tasks as tests/integration/test_container_tasks.py, through the verifier
service: the oracle scores every task with a solution 1, graders that break fail by name, the
machines carry their labels and limits and are removed with their rollout, and the containers of a
dead verifier are swept. testcontainers-python makes the fixture containers and reads the daemon
(its reaper, Ryuk, is an image from Docker Hub: TESTCONTAINERS_RYUK_DISABLED=true; the project's
own labels and sweep clean up, which these tests check)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.oracle import ORACLE_ROW_KEY, ORACLE_TOOL
from rollmesh.registry import Catalog, Root
from rollmesh.verifier.bridges.container.docker import LABEL, DockerProvider
from rollmesh.verifier.bridges.container.env import ContainerTasksEnvironment
from rollmesh.verifier.environment import Response
from rollmesh.verifier.service import VerifierService, VerifyCall
from rollmesh.verifier.testing import TEST_CONFIG

ROOT = Path(__file__).resolve().parents[1] / "container_tasks"
ENV = "harbor_demo"
BASE = "rollmesh-base:bookworm"


def _unavailable() -> str | None:
    hint = "`make test-containers` starts one with deploy/local-docker.sh"
    if shutil.which("docker") is None:
        return f"no Docker daemon: the docker CLI is not installed ({hint})"
    info = subprocess.run(["docker", "image", "inspect", BASE], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        return f"no Docker daemon with the local base image {BASE} at {where} ({hint})"
    return None


_REASON = _unavailable()
pytestmark = [pytest.mark.docker, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture
async def service(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[VerifierService]:
    monkeypatch.setenv("ROLLMESH_CONTAINER_PROVIDER", "docker")
    monkeypatch.setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
    found = VerifierService.from_catalog(TEST_CONFIG, Catalog([Root(ROOT, 0, "tests")]), entry_points=False)
    await found.start()
    try:
        yield found
    finally:
        await found.aclose()


def _env(service: VerifierService) -> ContainerTasksEnvironment:
    env = service.environment(ENV)
    assert isinstance(env, ContainerTasksEnvironment) and env.provider.name == "docker"
    return env


def _row(service: VerifierService, task: str, *, oracle: bool = False) -> str:
    row = _env(service).tasks[task].row()
    return json.dumps({**row, ORACLE_ROW_KEY: True} if oracle else row)


def _containers(**labels: str) -> list[Any]:
    """The daemon's containers with these rollmesh labels, through testcontainers' client."""
    from testcontainers.core.docker_client import DockerClient

    wanted = [f"{LABEL}.{k}={v}" for k, v in labels.items()] or [f"{LABEL}=1"]
    return list(DockerClient().client.containers.list(all=True, filters={"label": wanted}))


async def test_the_oracle_scores_every_task_with_a_solution_one_on_docker(service: VerifierService) -> None:
    solved = sorted(n for n, t in _env(service).tasks.items() if t.has_solution)

    async def oracle(name: str) -> tuple[str, float, dict[str, Any]]:
        sid = (
            await service.seed_session(ENV, _row(service, name, oracle=True), f"docker-oracle/{name}/0")
        ).session.id
        try:
            await service.call_tool(sid, ToolCall("o", ORACLE_TOOL, "{}"))
            verdict = await service.verify(VerifyCall(ENV, _row(service, name, oracle=True), Response(), sid))
        finally:
            await service.close_session(sid)
        return name, verdict.reward, verdict.details

    results = await asyncio.gather(*(oracle(n) for n in solved))
    assert {n: r for n, r, _ in results} == dict.fromkeys(solved, 1.0)
    assert {d["provider"] for _, _, d in results} == {"docker"}
    assert next(d for n, _, d in results if n == "hanging-agent")["agent_timed_out"] is True
    assert await asyncio.to_thread(_containers, job="docker-oracle") == []


@pytest.mark.parametrize(
    ("task", "reason"),
    [
        ("broken-tests", "TEST_SCRIPT_FAILED"),
        ("bad-reward", "BAD_REWARD_FILE"),
        ("slow-tests", "TEST_TIMEOUT"),
    ],
)
async def test_a_grader_that_fails_is_a_named_failure_on_docker(
    service: VerifierService, task: str, reason: str
) -> None:
    sid = (await service.seed_session(ENV, _row(service, task), f"docker-f/{task}/0")).session.id
    try:
        with pytest.raises(RollmeshError) as caught:
            await service.verify(VerifyCall(ENV, _row(service, task), Response(), sid))
    finally:
        await service.close_session(sid)
    assert caught.value.reason == reason, caught.value.message


async def test_an_image_that_does_not_build_fails_by_name_on_docker(service: VerifierService) -> None:
    with pytest.raises(RollmeshError) as caught:
        await service.seed_session(ENV, _row(service, "build-fails"), "docker-b/0/0")
    assert caught.value.reason == "IMAGE_BUILD_FAILED" and "no such package" in caught.value.message


async def test_a_machine_carries_its_labels_and_limits_and_goes_with_its_rollout(
    service: VerifierService,
) -> None:
    sid = (await service.seed_session(ENV, _row(service, "memory-hog"), "docker-l/8/1")).session.id
    try:
        found = await asyncio.to_thread(_containers, rollout="docker-l/8/1")
        assert len(found) == 1
        labels, host = found[0].labels, found[0].attrs["HostConfig"]
        assert (labels[f"{LABEL}.job"], labels[f"{LABEL}.task"], labels[f"{LABEL}.environment"]) == (
            "docker-l",
            "memory-hog",
            ENV,
        )
        assert host["Memory"] == 128 << 20 and host["NetworkMode"] == "none" and host["PidsLimit"] == 4096
        out = await service.call_tool(
            sid,
            ToolCall(
                "c", "shell", json.dumps({"command": "python3 -c 'b = bytearray(512 << 20)'; echo rc=$?"})
            ),
        )
        assert "rc=137" in out.output  # killed for the memory limit; the machine lives on
        assert "1 machine live: docker-l/8/1" in service.describe(ENV).description
    finally:
        await service.close_session(sid)
    assert await asyncio.to_thread(_containers, rollout="docker-l/8/1") == []


async def test_the_containers_of_a_dead_verifier_are_swept_at_the_next_start() -> None:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    dead = f"{socket.gethostname()}:999999999:1"  # no such process: its owner is gone
    other = f"another-host-{os.getpid()}:1:1"  # another host's verifier: not ours to judge
    containers = []
    for owner in (dead, other):
        container = DockerContainer(BASE).with_command(["sh", "-c", "echo up; exec sleep infinity"])
        container.with_kwargs(labels={LABEL: "1", f"{LABEL}.job": "swept", f"{LABEL}.owner": owner})
        await asyncio.to_thread(container.start)
        await asyncio.to_thread(wait_for_logs, container, "up", 60)
        containers.append(container)
    try:
        provider = DockerProvider()
        await provider.open()
        assert provider.problem() == ""
        left = await asyncio.to_thread(_containers, job="swept")
        assert [c.labels[f"{LABEL}.owner"] for c in left] == [other]
    finally:
        for container in containers:
            await asyncio.to_thread(_remove_quietly, container)


def _remove_quietly(container: Any) -> None:
    try:
        container.get_wrapped_container().remove(force=True)
    except Exception:  # already swept
        pass
