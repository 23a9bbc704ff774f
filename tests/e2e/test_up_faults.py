"""`rollmesh up` as a process manager, under faults (fake model backend, ephemeral ports):

- SIGKILL of each service (registry, verifier, gateway, scheduler) mid-job: `up` logs the signal,
  restarts the service on the same address, and the job completes (the scheduler's job is resumed
  by id on the restarted scheduler) with every (task_index, rollout_index) exactly once in
  rollouts.jsonl or failures.jsonl and the job's reported state and counts matching the files;
- SIGSTOP (a hang, not a death: `up` sees nothing) of the gateway or the verifier mid-job: a short
  hang (SIGCONT after 15 s) costs no rollout, the job succeeds with default retries; a hang past
  `retry.unavailable_budget_s` fails the job visibly within the budget and a health probe (FAILED,
  naming the service; not after keepalive's 80 s), counts matching the files, and once the service
  runs again a resume completes it exactly once;
- `--restart no`: a dead child stops the mesh and `up` exits 1;
- the restart budget: past `--max-restarts` within the window `up` gives up and exits 1;
- each child exports its restarts (`rollmesh_service_restarts_total`), 0 at first, one more each time;
- SIGTERM stops every child within `--grace`, then SIGKILLs one that does not stop (a stopped
  process: SIGSTOP).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from rollmesh.mesh.server import wait_serving
from rollmesh_client import Client
from rollmesh_client._scheduler import JobHandle
from rollmesh_client.v1 import scheduler_pb2 as spb
from tests.exactly_once import FolderTruth
from tests.exactly_once import check_exactly_once
from tests.exactly_once import expected_keys
from tests.exactly_once import read_keys
from tests.procs import ROLLMESH

SERVING = re.compile(r"^\[up\] (\w+) serving on (\S+) \(pid (\d+)(?:, metrics \S+)?\)$")


@dataclass
class Up:
    """One `rollmesh up --ephemeral --backend fake` and what it printed."""

    proc: subprocess.Popen[bytes]
    work: Path
    log_path: Path
    addrs: dict[str, str]

    def up_lines(self) -> list[str]:
        text = self.log_path.read_text(errors="replace")
        return [line for line in text.splitlines() if line.startswith("[up] ")]

    def pids(self, service: str) -> list[int]:
        """Every pid `service` has served under, oldest first."""
        return [int(m[3]) for line in self.up_lines() if (m := SERVING.match(line)) and m[1] == service]

    async def wait_until(self, what: str, ok: Callable[[], bool], timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(ok):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; up said:\n" + "\n".join(self.up_lines()))
            await asyncio.sleep(0.1)

    def wait_exit(self, timeout_s: float = 90) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise AssertionError("rollmesh up did not exit:\n" + "\n".join(self.up_lines())) from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (dead, not yet reaped by a parent that is gone) counts as dead
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def start_up(work: Path, *args: str) -> Up:
    """Start `rollmesh up` in its own session; returns once it printed the addresses (all SERVING)."""
    work.mkdir(parents=True, exist_ok=True)
    out, log = work / "up.json", work / "up.log"
    argv = [str(ROLLMESH), "up", "--ephemeral", "--backend", "fake", "--json"]
    with out.open("w") as o, log.open("w") as e:
        proc = subprocess.Popen(
            [*argv, "--output-dir", str(work / "runs"), *args],
            stdout=o,
            stderr=e,
            cwd=work,
            env={**os.environ, "ROLLMESH_LOG_JSON": "1"},
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while not out.read_text().strip().endswith("}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"rollmesh up not ready (exit {proc.poll()}):\n{log.read_text()[-5000:]}")
        time.sleep(0.2)
    return Up(proc, work, log, json.loads(out.read_text()))


def finish(up: Up) -> None:
    """Stop `up` if it still runs, and check no child outlived it."""
    pids = [pid for s in ("registry", "verifier", "gateway", "scheduler") for pid in up.pids(s)]
    if up.proc.poll() is None:
        os.killpg(up.proc.pid, signal.SIGTERM)
        up.wait_exit()
    for pid in pids:
        assert not _alive(pid), f"pid {pid} outlived rollmesh up"


# ---- SIGKILL each service mid-job -------------------------------------------------------------


@pytest.fixture(scope="module")
def mesh_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    up = start_up(tmp_path_factory.mktemp("up-faults"))
    try:
        yield up
    finally:
        finish(up)
    assert up.proc.returncode == 0, "\n".join(up.up_lines())


@pytest_asyncio.fixture
async def client(mesh_up: Up) -> AsyncIterator[Client]:
    for address in mesh_up.addrs.values():  # a previous test's restart has settled
        await wait_serving(address, timeout_s=120)
    async with await Client.connect(**mesh_up.addrs) as c:
        yield c


TASKS, REPEATS = 150, 4


def job_spec(runs: Path) -> spb.JobSpec:
    """Default retries: a rollout in flight when its service dies waits out the restart."""
    return spb.JobSpec(
        benchmark="arithmetic",
        limit=TASKS,
        num_repeats=REPEATS,
        concurrency=2,
        output_dir=str(runs),
    )


async def sigkill(up: Up, service: str) -> int:
    """SIGKILL `service`'s current process; returns once `up` has it serving again (new pid)."""
    pid = up.pids(service)[-1]
    os.kill(pid, signal.SIGKILL)
    await up.wait_until(f"{service} restarted", lambda: up.pids(service)[-1] != pid)
    lines = up.up_lines()
    assert f"[up] {service} (pid {pid}) was killed by signal SIGKILL" in lines
    assert any(line.startswith(f"[up] restarting {service} in ") for line in lines)
    assert up.addrs[service] in next(line for line in reversed(lines) if SERVING.match(line))
    return pid


async def wait_done(job: JobHandle, at_least: int) -> spb.Job:
    deadline = time.monotonic() + 120
    while (state := await job.get()).progress.done < at_least:
        assert state.state in (spb.JOB_STATE_PENDING, spb.JOB_STATE_RUNNING), state
        assert time.monotonic() < deadline, state
        await asyncio.sleep(0.05)
    assert state.state == spb.JOB_STATE_RUNNING, f"the job ended before the fault: {state}"
    return state


async def job_under_way(up: Up, client: Client, spec: spb.JobSpec | None = None) -> tuple[JobHandle, Path]:
    """Submit `spec` (default `job_spec`) to `up`'s scheduler; returns once 40 rollouts are done."""
    runs = up.work / "runs"
    job = await client.scheduler.submit(spec or job_spec(runs))
    await wait_done(job, 40)
    return job, runs


async def succeeds_exactly_once(job: JobHandle, runs: Path) -> FolderTruth:
    """Wait for the job; it must succeed with every key exactly once in rollouts.jsonl."""
    final = await job.result(poll_s=0.2, timeout_s=300)
    assert spb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED", final.error
    truth = check_exactly_once(runs / job.job_id, expected_keys(TASKS, REPEATS), job=final)
    assert len(truth.rollout_keys) == TASKS * REPEATS and not truth.failure_keys
    return truth


@pytest.mark.parametrize("service", ["registry", "verifier", "gateway"])
async def test_sigkill_a_service_mid_job_restarts_it_and_the_job_completes(
    mesh_up: Up, client: Client, service: str
) -> None:
    job, runs = await job_under_way(mesh_up, client)
    await sigkill(mesh_up, service)
    await succeeds_exactly_once(job, runs)


async def test_sigkill_the_scheduler_mid_job_then_resume_completes(mesh_up: Up, client: Client) -> None:
    runs = mesh_up.work / "runs"
    job = await client.scheduler.submit(job_spec(runs))
    rollouts = runs / job.job_id / "rollouts.jsonl"
    await mesh_up.wait_until("40 rows on disk", lambda: len(read_keys(rollouts)) >= 40)
    assert (await job.get()).state == spb.JOB_STATE_RUNNING
    before = set(read_keys(rollouts))  # rows on disk stay; buffered ones die with the process
    await sigkill(mesh_up, "scheduler")
    await wait_serving(mesh_up.addrs["scheduler"], timeout_s=120)
    # A new connection, as a new CLI command makes (the SDK's reads would also retry UNAVAILABLE
    # on the old one, tests/integration/test_sdk_retries.py).
    async with await Client.connect(scheduler=mesh_up.addrs["scheduler"]) as again:
        stale = await again.scheduler.get(job.job_id)  # the restarted scheduler knows it (job.json)
        assert stale.state not in (spb.JOB_STATE_RUNNING, spb.JOB_STATE_SUCCEEDED), stale
        resumed = await again.scheduler.submit(spb.JobSpec(resume_job_id=job.job_id, output_dir=str(runs)))
        assert resumed.job_id == job.job_id
        final = await resumed.result(poll_s=0.2, timeout_s=300)
    assert spb.JobState.Name(final.state) == "JOB_STATE_SUCCEEDED", final.error
    truth = check_exactly_once(runs / job.job_id, expected_keys(TASKS, REPEATS), job=final)
    assert len(truth.rollout_keys) == TASKS * REPEATS and before <= truth.rollout_keys


# ---- SIGSTOP (hang) a service mid-job -----------------------------------------------------------


@contextlib.contextmanager
def stopped(up: Up, service: str) -> Iterator[int]:
    """`service`'s current process stopped (SIGSTOP) for the block; continued on the way out."""
    pid = up.pids(service)[-1]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("service", ["verifier", "gateway"])
async def test_a_short_hang_of_a_service_mid_job_costs_no_rollout(
    mesh_up: Up, client: Client, service: str
) -> None:
    job, runs = await job_under_way(mesh_up, client)
    with stopped(mesh_up, service) as pid:
        await asyncio.sleep(15)
        assert (await job.get()).state == spb.JOB_STATE_RUNNING  # waiting, not failing
    await succeeds_exactly_once(job, runs)
    assert mesh_up.pids(service)[-1] == pid  # a hang is not a death: `up` restarted nothing


@pytest.mark.parametrize("service", ["verifier", "gateway"])
async def test_a_hang_past_the_budget_fails_the_job_visibly_then_resume_completes(
    mesh_up: Up, client: Client, service: str
) -> None:
    spec = job_spec(mesh_up.work / "runs")
    spec.retry.unavailable_budget_s = 5
    job, runs = await job_under_way(mesh_up, client, spec)
    with stopped(mesh_up, service):
        # Calls to a stopped process hang, and keepalive finds the channel dead only after
        # 60 s + 20 s: the watchdog cuts them once the service has answered none, nor a health
        # check, for the budget (5 s + a 5 s probe + a tick).
        started = time.monotonic()
        final = await job.result(poll_s=0.5, timeout_s=400)
        took = time.monotonic() - started
        assert spb.JobState.Name(final.state) == "JOB_STATE_FAILED", final
        assert f"the {service} has been unreachable" in final.error and "resume" in final.error, final.error
        assert took < 5 + 5 + 30, (took, final.error)  # budget + probe + slack for a loaded machine
        first = check_exactly_once(
            runs / job.job_id, expected_keys(TASKS, REPEATS), job=final, complete=False
        )
        assert len(first.keys) < TASKS * REPEATS
    await wait_serving(mesh_up.addrs[service], timeout_s=120)
    resumed = await client.scheduler.submit(spb.JobSpec(resume_job_id=job.job_id, output_dir=str(runs)))
    truth = await succeeds_exactly_once(resumed, runs)
    assert first.rollout_keys <= truth.rollout_keys  # rows kept; failures of the hang retried


def _restarts(metrics_address: str, service: str) -> float | None:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "rollmesh_service_restarts_total" and sample.labels == {"service": service}:
                return sample.value
    return None


async def test_a_restarted_service_exports_its_restarts(tmp_path: Path) -> None:
    """`up`'s restarts were counted nowhere: each child exports rollmesh_service_restarts_total, 0 at
    first, then one more per restart (on the metrics port it had, so the scrape target stays)."""
    up = start_up(tmp_path, "--metrics")
    try:
        metrics = up.addrs["metrics"]
        assert await asyncio.to_thread(_restarts, metrics["registry"], "registry") == 0
        assert await asyncio.to_thread(_restarts, metrics["gateway"], "gateway") == 0
        for n in (1, 2):
            await sigkill(up, "registry")
            await wait_serving(up.addrs["registry"], timeout_s=120)
            assert await asyncio.to_thread(_restarts, metrics["registry"], "registry") == n
        assert await asyncio.to_thread(_restarts, metrics["gateway"], "gateway") == 0
    finally:
        finish(up)


# ---- restart policy, give-up, stop --------------------------------------------------------------


async def test_restart_no_stops_the_mesh_and_exits_1(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--restart", "no")
    try:
        pid = up.pids("verifier")[-1]
        os.kill(pid, signal.SIGKILL)
        code = await asyncio.to_thread(up.wait_exit)
        lines = up.up_lines()
        assert code == 1, lines
        assert f"[up] verifier (pid {pid}) was killed by signal SIGKILL" in lines
        assert "[up] restart policy 'no': not restarting verifier" in lines
        assert len(up.pids("verifier")) == 1
    finally:
        finish(up)


async def test_gives_up_after_max_restarts_within_the_window(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--max-restarts", "1", "--restart-window", "600")
    try:
        await sigkill(up, "gateway")  # restart 1 of 1
        pid = up.pids("gateway")[-1]
        os.kill(pid, signal.SIGKILL)
        code = await asyncio.to_thread(up.wait_exit)
        lines = up.up_lines()
        assert code == 1, lines
        assert "[up] giving up on gateway: 1 restarts within 600 s" in lines
        assert len(up.pids("gateway")) == 2
    finally:
        finish(up)


async def test_sigterm_stops_every_child_within_the_grace_then_kills(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--grace", "3")
    try:
        stuck = up.pids("registry")[-1]
        os.kill(stuck, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
        started = time.monotonic()
        os.kill(up.proc.pid, signal.SIGTERM)
        code = await asyncio.to_thread(up.wait_exit, 60)
        took = time.monotonic() - started
        lines = up.up_lines()
        assert code == 0, lines
        assert f"[up] registry (pid {stuck}) still running; killing it" in lines
        assert took < 3 + 30, took  # the grace, plus slack for a loaded machine
        assert lines[-1] == "[up] stopped"
    finally:
        finish(up)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
async def test_sigkill_of_up_itself_stops_every_child(tmp_path: Path) -> None:
    """`up` cannot clean up after a SIGKILL: the kernel tells each child (PR_SET_PDEATHSIG)."""
    up = start_up(tmp_path)
    pids = {s: up.pids(s)[-1] for s in ("registry", "verifier", "gateway", "scheduler")}
    try:
        assert all(_alive(pid) for pid in pids.values())
        os.kill(up.proc.pid, signal.SIGKILL)
        await asyncio.to_thread(up.wait_exit, 30)
        deadline = time.monotonic() + 90
        while alive := [s for s, pid in pids.items() if _alive(pid)]:
            assert time.monotonic() < deadline, f"outlived a SIGKILLed rollmesh up: {alive}"
            await asyncio.sleep(0.2)
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # each child leads its own session
        finish(up)
