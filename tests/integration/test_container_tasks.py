"""The container-task environment on the daemonless provider, through the verifier service (seed,
tools, verify, close, as the gRPC servicer calls them): the test suite's Harbor tasks
(tests/container_tasks) in real machines (overlayfs, namespaces, cgroups; root needed). What it
checks: the machine's tools, the tests hidden until verify, every named failure (never a reward of
0), the task limits (memory, network), the isolation (host files, pids, capabilities), a machine lost
mid-rollout, labels, and that nothing is left behind, after a SIGKILL of the verifier too.

The first run builds the local Debian base (debootstrap, minutes) and the tasks' images (apt-get
python3-pytest, seconds): both are cached (`$ROLLMESH_CACHE_DIR`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.oracle import ORACLE_ROW_KEY
from rollmesh.mesh.oracle import ORACLE_TOOL
from rollmesh.registry.catalog import Catalog
from rollmesh.registry.catalog import Root
from rollmesh.verifier.bridges.container import cgroups
from rollmesh.verifier.bridges.container.daemonless import MACHINES_DIR
from rollmesh.verifier.bridges.container.daemonless import DaemonlessProvider
from rollmesh.verifier.bridges.container.env import ContainerTasksEnvironment
from rollmesh.verifier.environment import Response
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall
from rollmesh.verifier.testing import TEST_CONFIG

ROOT = Path(__file__).resolve().parents[1] / "container_tasks"
ENV = "harbor_demo"
pytestmark = [
    pytest.mark.skipif(
        DaemonlessProvider().problem() != "", reason=f"daemonless machines: {DaemonlessProvider().problem()}"
    ),
    # The first run makes the local Debian base (debootstrap: minutes) and the tasks' images.
    pytest.mark.timeout(1800),
]


@pytest.fixture
async def service() -> AsyncIterator[VerifierService]:
    found = VerifierService.from_catalog(TEST_CONFIG, Catalog([Root(ROOT, 0, "tests")]), entry_points=False)
    await found.start()
    try:
        yield found
    finally:
        await found.aclose()


def _env(service: VerifierService) -> ContainerTasksEnvironment:
    env = service.environment(ENV)
    assert isinstance(env, ContainerTasksEnvironment)
    return env


def _row(service: VerifierService, task: str, *, oracle: bool = False) -> dict[str, Any]:
    row = _env(service).tasks[task].row()
    return {**row, ORACLE_ROW_KEY: True} if oracle else row


async def _seed(service: VerifierService, task: str, sid: str, *, oracle: bool = False) -> str:
    seeded = await service.seed_session(ENV, json.dumps(_row(service, task, oracle=oracle)), sid)
    return seeded.session.id


async def _tool(service: VerifierService, sid: str, name: str, **arguments: Any) -> str:
    out = await service.call_tool(sid, ToolCall(f"c-{name}", name, json.dumps(arguments)))
    return out.output


async def _verify(service: VerifierService, task: str, sid: str, *, oracle: bool = False) -> Any:
    row = json.dumps(_row(service, task, oracle=oracle))
    return await service.verify(VerifyCall(ENV, row, Response(), sid))


def _existing(paths: list[str]) -> list[str]:
    return [p for p in paths if Path(p).exists()]


def _read(path: Path) -> str:
    return path.read_text()


def _memory_limit(groups: list[str]) -> int:
    for group in groups:
        for name in ("memory.limit_in_bytes", "memory.max"):
            if Path(group, name).is_file():
                return int(Path(group, name).read_text())
    return 0


async def _run(service: VerifierService, task: str, sid: str, **calls: dict[str, Any]) -> Any:
    """Seed, make each (tool -> arguments) call, verify and close: the verdict (or its error)."""
    await _seed(service, task, sid)
    try:
        for name, arguments in calls.items():
            await _tool(service, sid, name, **arguments)
        return await _verify(service, task, sid)
    finally:
        await service.close_session(sid)


async def test_every_task_with_a_solution_scores_one_under_the_oracle(service: VerifierService) -> None:
    env = _env(service)
    solved = sorted(name for name, task in env.tasks.items() if task.has_solution)
    assert len(solved) >= 6

    async def oracle(name: str) -> tuple[str, float, dict[str, Any]]:
        sid = f"oracle-job/{name}/0"
        await _seed(service, name, sid, oracle=True)
        try:
            await service.call_tool(sid, ToolCall("o", ORACLE_TOOL, "{}"))
            verdict = await _verify(service, name, sid, oracle=True)
        finally:
            await service.close_session(sid)
        return name, verdict.reward, verdict.details

    results = await asyncio.gather(*(oracle(n) for n in solved))
    assert {name: reward for name, reward, _ in results} == dict.fromkeys(solved, 1.0)
    details = {name: d for name, _, d in results}
    assert details["hanging-agent"]["agent_timed_out"] is True  # graded after its time was cut
    assert details["answer-json"]["reward_file"] == "reward.json"


async def test_the_oracle_tool_is_refused_to_a_rollout_that_is_not_the_oracles(
    service: VerifierService,
) -> None:
    sid = await _seed(service, "fix-calc", "job-o/0/0")
    try:
        with pytest.raises(RollmeshError) as caught:
            await service.call_tool(sid, ToolCall("o", ORACLE_TOOL, "{}"))
        assert caught.value.reason == "TOOL_NOT_FOUND"
        seeded = await service.seed_session(
            ENV, json.dumps(_row(service, "hello-file", oracle=True)), "o/1/0"
        )
        with pytest.raises(RollmeshError) as no_solution:
            await service.call_tool(seeded.session.id, ToolCall("o", ORACLE_TOOL, "{}"))
        assert no_solution.value.reason == "NO_SOLUTION"
        await service.close_session(seeded.session.id)
    finally:
        await service.close_session(sid)


async def test_the_tools_work_in_the_machine_and_the_tests_stay_hidden_until_verify(
    service: VerifierService,
) -> None:
    sid = await _seed(service, "hello-file", "job-t/0/0")
    try:
        assert "wrote 13 bytes" in await _tool(
            service, sid, "write_file", path="/app/hello.txt", content="Hello, world!"
        )
        assert await _tool(service, sid, "read_file", path="/app/hello.txt") == "Hello, world!"
        hidden = await _tool(service, sid, "shell", command="ls /tests /solution")
        assert hidden.startswith("exit code: 2") and hidden.count("No such file") == 2
        assert await _tool(service, sid, "shell", command="pwd") == "exit code: 0\n/app"
        long = await _tool(service, sid, "shell", command="seq 1 200000")
        assert len(long) < 20_000 and "bytes dropped" in long and long.rstrip().endswith("200000")
        cut = await _tool(service, sid, "shell", command="sleep 30", timeout_s=1)
        assert "[the command was cut after 1s]" in cut
        missing = await _tool(service, sid, "read_file", path="/nope")
        assert missing.startswith("error:") and "No such file" in missing
        verdict = await _verify(service, "hello-file", sid)
        assert verdict.reward == 1.0 and verdict.details["commands"] == 7
    finally:
        await service.close_session(sid)


@pytest.mark.parametrize(
    ("task", "reason"),
    [
        ("broken-tests", "TEST_SCRIPT_FAILED"),
        ("bad-reward", "BAD_REWARD_FILE"),
        ("slow-tests", "TEST_TIMEOUT"),
    ],
)
async def test_a_grader_that_fails_is_a_named_failure_never_zero(
    service: VerifierService, task: str, reason: str
) -> None:
    with pytest.raises(RollmeshError) as caught:
        await _run(service, task, f"job-f/{task}/0")
    assert caught.value.reason == reason, caught.value.message


async def test_an_image_that_does_not_build_fails_its_seed_by_name(service: VerifierService) -> None:
    with pytest.raises(RollmeshError) as caught:
        await _seed(service, "build-fails", "job-b/0/0")
    assert caught.value.reason == "IMAGE_BUILD_FAILED"
    assert "Dockerfile line 2 (RUN) exited 1: no such package" in caught.value.message


async def test_what_the_agent_put_in_tests_is_gone_before_the_tests_run(service: VerifierService) -> None:
    """A conftest.py the agent planted in /tests would be collected by the task's own pytest."""
    sid = await _seed(service, "hello-file", "job-p/0/0")
    try:
        await _tool(service, sid, "write_file", path="/app/hello.txt", content="Hello, world!")
        await _tool(service, sid, "write_file", path="/tests/conftest.py", content="raise SystemExit(0)\n")
        assert (await _verify(service, "hello-file", sid)).reward == 1.0
        assert await _tool(service, sid, "shell", command="ls /tests") == "exit code: 0\ntest.sh"
    finally:
        await service.close_session(sid)


async def test_a_compose_task_with_other_services_is_refused_by_name(service: VerifierService) -> None:
    """The daemonless provider runs the main service alone: a task whose compose file has others
    fails its seed naming them (the Docker provider runs them: tests/e2e/test_container_tasks_docker.py)."""
    row = json.dumps(service.environment("compose_services").tasks["side-service"].row())  # type: ignore[attr-defined]
    with pytest.raises(RollmeshError) as caught:
        await service.seed_session("compose_services", row, "job-c/0/0")
    assert caught.value.reason == "COMPOSE_SERVICES_UNSUPPORTED"
    assert "side-service" in caught.value.message and "(notes)" in caught.value.message


async def test_the_machine_is_isolated_from_the_host(service: VerifierService, tmp_path: Path) -> None:
    marker = tmp_path / "host-secret"
    marker.write_text("secret")
    sid = await _seed(service, "hello-file", "job-i/0/0")
    try:
        seen = await _tool(
            service,
            sid,
            "shell",
            command=f"cat {marker}; ls /proc | grep -c '^[0-9]'; hostname; grep CapBnd /proc/self/status; "
            "cat /proc/self/uid_map; "
            "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)' 2>&1 "
            "| tail -1",
        )
    finally:
        await service.close_session(sid)
    assert "No such file" in seen  # the host's files are not there
    lines = seen.splitlines()
    processes = int(next(ln for ln in lines if ln.isdigit()))
    assert processes < 10  # its own pid namespace: pid 1, the shell and what it runs
    assert any(ln.startswith("rm-") for ln in lines)  # its own hostname
    assert "CapBnd:\t00000000a80425fb" in seen  # Docker's default capability set
    assert "Network is unreachable" in seen
    inside, outside, count = next(
        ln.split() for ln in lines if ln.split()[:1] == ["0"] and len(ln.split()) == 3
    )
    assert (inside, count) == ("0", "65536") and int(outside) >= 2_000_000_000  # its own block of host uids


async def test_labels_follow_the_rollout_and_close_removes_the_machine(service: VerifierService) -> None:
    sid = await _seed(service, "hello-file", "job-l/7/2")
    machine = _env(service).provider.live()[0]
    folder = MACHINES_DIR / machine.id
    label = json.loads(_read(folder / "label.json"))
    assert (label["job"], label["rollout"], label["task"], label["environment"]) == (
        "job-l",
        "job-l/7/2",
        "hello-file",
        ENV,
    )
    groups = label["cgroups"]
    assert groups and _existing(groups) == groups
    described = service.describe(ENV)
    assert described.sandbox == "container:daemonless"
    assert described.description.endswith("on the daemonless provider; 1 machine live: job-l/7/2")
    await service.close_session(sid)
    assert _existing([str(folder), *groups]) == []
    assert service.describe(ENV).description.endswith("0 machines live")
    assert _env(service).provider.live() == []


async def test_a_machine_lost_mid_rollout_fails_it_as_machine_lost(service: VerifierService) -> None:
    sid = await _seed(service, "hello-file", "job-m/0/0")
    try:
        machine = _env(service).provider.live()[0]
        label = json.loads(_read(MACHINES_DIR / machine.id / "label.json"))
        os.killpg(label["keeper_pid"], signal.SIGKILL)
        with pytest.raises(RollmeshError) as caught:
            for _ in range(100):  # until the verifier has seen its keeper exit
                await _tool(service, sid, "shell", command="true")
                await asyncio.sleep(0.05)
        assert caught.value.reason == "MACHINE_LOST"
        with pytest.raises(RollmeshError) as verdict:
            await _verify(service, "hello-file", sid)
        assert verdict.value.reason == "MACHINE_LOST"
    finally:
        await service.close_session(sid)


async def test_the_memory_limit_holds_and_is_the_tasks(service: VerifierService) -> None:
    sid = await _seed(service, "memory-hog", "job-mem/0/0")
    try:
        machine = _env(service).provider.live()[0]
        label = json.loads(_read(MACHINES_DIR / machine.id / "label.json"))
        if "memory" not in cgroups.available():
            pytest.skip("this kernel offers no memory cgroup")
        assert _memory_limit(label["cgroups"]) == 128 << 20
        out = await _tool(service, sid, "shell", command="python3 -c 'b = bytearray(512 << 20)'; echo rc=$?")
        assert "rc=137" in out  # SIGKILLed by the kernel for the limit
        assert "still" in await _tool(service, sid, "shell", command="echo still")  # the machine lives on
    finally:
        await service.close_session(sid)


_OWNER = """
import asyncio, json, sys
from pathlib import Path
from rollmesh.registry.catalog import Catalog, Root
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.testing import TEST_CONFIG

async def main():
    catalog = Catalog([Root(Path(sys.argv[1]), 0, "t")])
    service = VerifierService.from_catalog(TEST_CONFIG, catalog, entry_points=False)
    await service.start()
    env = service.environment("harbor_demo")
    await service.seed_session("harbor_demo", json.dumps(env.tasks["hello-file"].row()), "killed-job/0/0")
    print(env.provider.live()[0].id, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_machines_of_a_sigkilled_verifier_are_removed_at_the_next_start(tmp_path: Path) -> None:
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(_OWNER))
    owner = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(ROOT), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert owner.stdout is not None
        machine_id = ""
        while not machine_id.startswith("rm-"):  # (its log lines come first)
            line = await owner.stdout.readline()
            assert line, "the owner ended before it printed its machine"
            machine_id = line.decode().strip()
        label = json.loads(_read(MACHINES_DIR / machine_id / "label.json"))
    finally:
        owner.kill()
        await owner.wait()
    assert _existing([str(MACHINES_DIR / machine_id)])  # left behind by the SIGKILL
    found = VerifierService.from_catalog(TEST_CONFIG, Catalog([Root(ROOT, 0, "tests")]), entry_points=False)
    await found.start()  # its environment sweeps the machines whose owner is gone
    try:
        assert _existing([str(MACHINES_DIR / machine_id), *label["cgroups"]]) == []
    finally:
        await found.aclose()


async def test_harbors_own_template_runs_as_written_and_names_its_missing_reward(
    service: VerifierService,
) -> None:
    """`harbor tasks init` (shared verifier, no pytest), unchanged: its solve.sh runs (it does
    nothing), its test.sh writes no reward: NO_REWARD_FILE, never a 0."""
    env = service.environment("harbor_template")
    assert isinstance(env, ContainerTasksEnvironment)
    row = json.dumps({**env.tasks["harbor-template"].row(), ORACLE_ROW_KEY: True})
    sid = (await service.seed_session("harbor_template", row, "job-tpl/0/0")).session.id
    try:
        solved = await service.call_tool(sid, ToolCall("o", ORACLE_TOOL, "{}"))
        assert solved.output == "exit code: 0"
        with pytest.raises(RollmeshError) as caught:
            await service.verify(VerifyCall("harbor_template", row, Response(), sid))
    finally:
        await service.close_session(sid)
    assert caught.value.reason == "NO_REWARD_FILE"


async def test_warm_machines_are_started_ahead_and_each_serves_one_rollout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ROLLMESH_CONTAINER_WARM", "2")
    found = VerifierService.from_catalog(TEST_CONFIG, Catalog([Root(ROOT, 0, "tests")]), entry_points=False)
    await found.start()
    provider = _env(found).provider
    made: set[str] = set()
    try:

        async def live(count: int) -> list[Any]:
            for _ in range(600):  # the pool fills in the background (bounded wait, no sleep-and-hope)
                machines = provider.live()
                if len(machines) >= count:
                    return machines
                await asyncio.sleep(0.05)
            raise AssertionError(f"{len(provider.live())} machines live, wanted {count}")

        first = await _seed(found, "hello-file", "job-w/0/0")
        warm = {m.id for m in await live(3) if m.labels.job == "warm"}
        assert len(warm) == 2  # started ahead, labelled as nobody's yet
        second = await _seed(found, "hello-file", "job-w/1/0")
        taken = next(m for m in provider.live() if m.labels.rollout == "job-w/1/0")
        assert taken.id in warm  # a warm machine, now the rollout's, on its host label too
        assert json.loads(_read(MACHINES_DIR / taken.id / "label.json"))["rollout"] == "job-w/1/0"
        made = {m.id for m in await live(4)}  # the pool made up again: 2 rollouts + 2 warm
        verdict = await _verify(found, "hello-file", second)
        assert verdict.details["machine"] == taken.id
        for sid in (first, second):
            await found.close_session(sid)
        assert sorted(m.labels.job for m in provider.live()) == ["warm", "warm"]
    finally:
        await found.aclose()
    assert _existing([str(MACHINES_DIR / m) for m in made]) == []


async def test_a_session_nobody_closes_has_its_machine_removed_when_it_expires() -> None:
    """A scheduler SIGKILLed mid-rollout never closes its sessions: the verifier's idle expiry
    releases them, and the environment removes their machines."""
    config = dataclasses.replace(TEST_CONFIG, session_ttl_s=1.0)
    found = VerifierService.from_catalog(config, Catalog([Root(ROOT, 0, "tests")]), entry_points=False)
    await found.start()
    try:
        await _seed(found, "hello-file", "job-gone/0/0")
        machine = _env(found).provider.live()[0]
        for _ in range(600):  # the sweeper runs every 0.5 s here
            if not _existing([str(MACHINES_DIR / machine.id)]):
                break
            await asyncio.sleep(0.05)
        assert _existing([str(MACHINES_DIR / machine.id)]) == []
        assert _env(found).provider.live() == []
    finally:
        await found.aclose()


async def test_cpu_processes_and_storage_limits_are_the_tasks(service: VerifierService) -> None:
    """fix-calc asks for 1 CPU, answer-json for 512 MiB of storage (the older `storage = "512M"`)."""
    cpu = await _seed(service, "fix-calc", "job-lim/0/0")
    disk = await _seed(service, "answer-json", "job-lim/1/0")
    try:
        groups = {m.labels.task: _read_label(m.id)["cgroups"] for m in _env(service).provider.live()}
        if "cpu" in cgroups.available():
            assert _cgroup_value(groups["fix-calc"], ("cpu.cfs_quota_us", "cpu.max")).split()[0] == "100000"
        if "pids" in cgroups.available():
            assert _cgroup_value(groups["fix-calc"], ("pids.max",)) == "4096"
        size = await _tool(service, disk, "shell", command="df -m / | tail -1 | awk '{print $2}'")
        assert size.splitlines()[-1] == "512"
        full = await _tool(service, disk, "shell", command="head -c 600M /dev/zero > /big; echo rc=$?")
        assert "No space left on device" in full and "rc=1" in full
    finally:
        await service.close_session(cpu)
        await service.close_session(disk)


def _read_label(machine_id: str) -> dict[str, Any]:
    return dict(json.loads((MACHINES_DIR / machine_id / "label.json").read_text()))


def _cgroup_value(groups: list[str], names: tuple[str, ...]) -> str:
    for group in groups:
        for name in names:
            if Path(group, name).is_file():
                return Path(group, name).read_text().strip()
    return ""


async def test_a_build_copies_files_in_without_a_process_and_chowns_only_what_it_copied(
    tmp_path: Path,
) -> None:
    """COPY goes through the machine's own extraction (no sh or tar started); `--chown` changes
    the files that step copied, not the folder they were copied into (as Docker)."""
    from rollmesh.verifier.bridges.container.images import dockerfile_recipe
    from rollmesh.verifier.bridges.container.provider import Labels
    from rollmesh.verifier.bridges.container.task import Limits

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.sh").write_text(f"#!/bin/sh\necho built {os.getpid()} {tmp_path.name}\n")
    (tmp_path / "sub" / "run.sh").chmod(0o755)
    (tmp_path / "note.txt").write_text("note\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM rollmesh-base:bookworm\nWORKDIR /app\nCOPY sub /app/sub\nCOPY --chown=nobody note.txt /app/\n"
        "RUN /app/sub/run.sh > /app/built.txt\n"
    )
    provider = DaemonlessProvider()
    await provider.open()
    try:
        made = dockerfile_recipe(tmp_path / "Dockerfile", tmp_path, {}, where="t")
        image = await provider.prepare(made, timeout_s=600, where="t")
        machine = await provider.start(image, Limits(), Labels("job-k", "job-k/0/0"))
        said = await machine.exec(
            [
                "sh",
                "-c",
                "stat -c '%U %a %n' /app /app/sub /app/sub/run.sh /app/note.txt; cat /app/built.txt",
            ],
            timeout_s=30,
            output_limit=4096,
        )
        assert said.stdout.decode().splitlines() == [
            "root 755 /app",
            "root 755 /app/sub",
            "root 755 /app/sub/run.sh",
            "nobody 644 /app/note.txt",
            f"built {os.getpid()} {tmp_path.name}",
        ]
    finally:
        await provider.aclose()
