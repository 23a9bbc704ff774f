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
from rollmesh.mesh.oracle import ORACLE_ROW_KEY
from rollmesh.mesh.oracle import ORACLE_TOOL
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.verifier.bridges.container.docker import LABEL
from rollmesh.verifier.bridges.container.docker import DockerProvider
from rollmesh.verifier.bridges.container.env import ContainerTasksEnvironment
from rollmesh.verifier.environment import Response
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
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


async def _tool(service: VerifierService, sid: str, name: str, **arguments: Any) -> str:
    return (await service.call_tool(sid, ToolCall("t", name, json.dumps(arguments)))).output


async def test_the_tools_run_in_the_machine_with_the_tasks_folder_and_variables_on_docker(
    service: VerifierService,
) -> None:
    sid = (await service.seed_session(ENV, _row(service, "hello-file"), "docker-t/0/0")).session.id
    try:
        wrote = await _tool(service, sid, "write_file", path="/app/hello.txt", content="Hello, world!")
        assert "wrote 13 bytes" in wrote  # stdin up the exec's hijacked connection
        assert await _tool(service, sid, "read_file", path="/app/hello.txt") == "Hello, world!"
        hidden = await _tool(service, sid, "shell", command="ls /tests /solution")
        assert hidden.startswith("exit code: 2") and hidden.count("No such file") == 2
        said = await _tool(service, sid, "shell", command='pwd; echo "$TASK_GREETING"; echo oops >&2; exit 3')
        assert said == "exit code: 3\n/app\nfrom task.toml\n[stderr]\noops"
        long = await _tool(service, sid, "shell", command="seq 1 200000")
        assert len(long) < 20_000 and "bytes dropped" in long and long.rstrip().endswith("200000")
        cut = await _tool(service, sid, "shell", command="sleep 30", timeout_s=1)
        assert "[the command was cut after 1s]" in cut
        await _tool(service, sid, "write_file", path="/tests/conftest.py", content="planted")
        verdict = await service.verify(VerifyCall(ENV, _row(service, "hello-file"), Response(), sid))
        assert verdict.reward == 1.0 and verdict.details["provider"] == "docker"
        assert await _tool(service, sid, "shell", command="ls /tests") == "exit code: 0\ntest.sh"
    finally:
        await service.close_session(sid)


async def test_a_compose_tasks_other_services_run_beside_the_machine_and_go_with_it(
    service: VerifierService,
) -> None:
    """side-service's compose file has a `notes` HTTP server with a healthcheck: it starts (healthy)
    on the machine's private network, where solve.sh reaches it by name; then all goes."""
    env = "compose_services"
    found = service.environment(env)
    assert isinstance(found, ContainerTasksEnvironment)
    row = json.dumps({**found.tasks["side-service"].row(), ORACLE_ROW_KEY: True})
    sid = (await service.seed_session(env, row, "docker-c/0/0")).session.id
    try:
        made = await asyncio.to_thread(_containers, rollout="docker-c/0/0")
        services = sorted(c.labels.get(f"{LABEL}.service", "main") for c in made)
        assert services == ["main", "notes"]
        side = next(c for c in made if c.labels.get(f"{LABEL}.service") == "notes")
        assert side.attrs["State"]["Health"]["Status"] == "healthy"
        network = side.attrs["HostConfig"]["NetworkMode"]
        await service.call_tool(sid, ToolCall("o", ORACLE_TOOL, "{}"))
        verdict = await service.verify(VerifyCall(env, row, Response(), sid))
        assert verdict.reward == 1.0
    finally:
        await service.close_session(sid)
    assert await asyncio.to_thread(_containers, rollout="docker-c/0/0") == []
    assert await asyncio.to_thread(_networks, network) == []


def _networks(name: str) -> list[Any]:
    from testcontainers.core.docker_client import DockerClient

    return list(DockerClient().client.networks.list(names=[name]))


async def test_a_machine_lost_mid_rollout_fails_it_as_machine_lost_on_docker(
    service: VerifierService,
) -> None:
    sid = (await service.seed_session(ENV, _row(service, "hello-file"), "docker-m/0/0")).session.id
    try:
        (found,) = await asyncio.to_thread(_containers, rollout="docker-m/0/0")
        await asyncio.to_thread(found.remove, force=True)  # the daemon loses it under the rollout
        with pytest.raises(RollmeshError) as caught:
            await _tool(service, sid, "shell", command="true")
        assert caught.value.reason == "MACHINE_LOST" and "No such container" in caught.value.message
        with pytest.raises(RollmeshError) as verdict:
            await service.verify(VerifyCall(ENV, _row(service, "hello-file"), Response(), sid))
        assert verdict.value.reason == "MACHINE_LOST"
    finally:
        await service.close_session(sid)


async def test_a_storage_limit_the_daemon_cannot_enforce_is_refused_by_name(service: VerifierService) -> None:
    """answer-json sets `storage = "512M"`: a daemon whose storage driver sizes containers gets it as
    the container's size; one that cannot (overlay2 on ext4, as here) refuses the task by name,
    unless the environment accepts it unenforced (`docker_storage`, which harbor_demo sets)."""
    provider = _env(service).provider
    assert isinstance(provider, DockerProvider) and provider.storage_unenforced
    provider.storage_unenforced = False
    try:
        if provider.sizes_storage:
            sid = (await service.seed_session(ENV, _row(service, "answer-json"), "docker-s/0/0")).session.id
            try:
                found = await asyncio.to_thread(_containers, rollout="docker-s/0/0")
                assert found[0].attrs["HostConfig"]["StorageOpt"] == {"size": "512m"}
            finally:
                await service.close_session(sid)
        else:
            with pytest.raises(RollmeshError) as caught:
                await service.seed_session(ENV, _row(service, "answer-json"), "docker-s/0/0")
            assert caught.value.reason == "STORAGE_LIMIT_UNSUPPORTED"
            assert "answer-json" in caught.value.message and "512 MB" in caught.value.message
            assert await asyncio.to_thread(_containers, rollout="docker-s/0/0") == []
    finally:
        provider.storage_unenforced = True


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
    network = await asyncio.to_thread(_labelled_network, f"rm-swept-{os.getpid()}", dead)
    provider = DockerProvider()
    try:
        await provider.open()
        assert provider.problem() == ""
        left = await asyncio.to_thread(_containers, job="swept")
        assert [c.labels[f"{LABEL}.owner"] for c in left] == [other]
        assert await asyncio.to_thread(_networks, network) == []  # as a compose task's services have
    finally:
        await provider.aclose()
        for container in containers:
            await asyncio.to_thread(_remove_quietly, container)


def _labelled_network(name: str, owner: str) -> str:
    """A network labelled as a machine's of `owner` (as a compose task's services have one)."""
    from testcontainers.core.docker_client import DockerClient

    DockerClient().client.networks.create(name, internal=True, labels={LABEL: "1", f"{LABEL}.owner": owner})
    return name


def _remove_quietly(container: Any) -> None:
    try:
        container.get_wrapped_container().remove(force=True)
    except Exception:  # already swept
        pass
