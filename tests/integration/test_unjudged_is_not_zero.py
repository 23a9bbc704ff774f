"""No verdict is never a reward of 0, end to end: the real verifier's `code` environment behind
the real scheduler (over gRPC, a fake gateway answering with correct code), its sandbox made to
die before the code runs. A sandbox down for a few runs is retried: every rollout ends with the
reward its code earned (1.0), none with 0. A sandbox that stays down fails the rollouts as
CHECK_FAILED: failures.jsonl, the job's failure summary, metrics.json and the CLI's exit code
say so, and rollouts.jsonl holds no row scored without a verdict."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_asyncio

from rollmesh.commands._exit import EXIT_JOB_FAILED
from rollmesh.mesh.server import ServiceBinding
from rollmesh.registry import BUILTIN_ROOT
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.registry import RootsConfig
from rollmesh.scheduler.manager import JobManager
from rollmesh.scheduler.remote import GatewayModel
from rollmesh.scheduler.remote import VerifierEnv
from rollmesh.scheduler.servicer import SchedulerServicer
from rollmesh.verifier import SandboxConfig
from rollmesh.verifier import SandboxLimits
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.servicer import VerifierServicer
from rollmesh_client.v1 import gateway_pb2
from tests.conftest import StartServer
from tests.fakes import FakeGateway
from tests.fakes import Json
from tests.procs import run_cli

LIMITS = SandboxLimits(wall_s=30.0, cpu_s=4, memory_mb=256, nproc=16, fsize_mb=1, output_kb=16)
DIES_AT_START = ["/bin/sh", "-c", "echo 'mount: sbxroot: permission denied' >&2; exit 32"]
TASKS = 4


def honest_code(req: gateway_pb2.GenerateRequest, turn: int) -> Json:
    return {"content": "```python\ndef add(a, b):\n    return a + b\n```"}


@dataclass
class Stack:
    scheduler: str
    sandbox: Sandbox
    data: Path
    out: Path


class FlakySandbox:
    """Makes the first `down` runs of `sandbox` die before the code runs (-1: every run)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.real = sandbox._command
        self.down = 0
        self.calls = 0
        sandbox._command = self.command  # type: ignore[method-assign]

    def command(self, mode: str, root: Path, work: Path, limits: SandboxLimits, uid: int) -> list[str]:
        self.calls += 1
        if self.down < 0 or self.calls <= self.down:
            return DIES_AT_START
        return self.real(mode, root, work, limits, uid)


@pytest_asyncio.fixture
async def stack(start_server: StartServer, tmp_path: Path) -> AsyncIterator[tuple[Stack, FlakySandbox]]:
    cfg = VerifierConfig(sandbox=SandboxConfig(concurrency=2, limits=LIMITS))
    roots = RootsConfig(Path("/nonexistent"), (), BUILTIN_ROOT, False)
    svc = VerifierService.from_catalog(cfg, Catalog.from_config(roots), entry_points=False)
    await svc.start()
    sandbox: Sandbox = svc.environment("code").sandbox  # type: ignore[attr-defined]
    flaky = FlakySandbox(sandbox)
    gw = FakeGateway(script=honest_code)
    gw_server = await start_server([gw.binding()])
    ver_server = await start_server([ServiceBinding.of(VerifierServicer(svc))])
    model = GatewayModel.connect(gw_server.address)
    env = VerifierEnv.connect(ver_server.address)
    out = tmp_path / "runs"
    manager = JobManager(Catalog([Root(BUILTIN_ROOT, 0, "root")]), model=model, env=env, output_dir=str(out))
    sched = await start_server([ServiceBinding.of(SchedulerServicer(manager))])
    data = tmp_path / "code.jsonl"
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": f"Write add (#{i})."}]},
            "verifier_metadata": {"tests": [f"assert add({i}, 2) == {i + 2}"]},
        }
        for i in range(TASKS)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        yield Stack(sched.address, sandbox, data, out), flaky
    finally:
        await manager.aclose()
        await model.close()
        await env.close()
        await svc.aclose()


def _submit(s: Stack) -> list[str]:
    return [
        "jobs",
        "submit",
        "--scheduler",
        s.scheduler,
        "--dataset",
        str(s.data),
        "--environment",
        "code",
        "--output-dir",
        str(s.out),
        "--concurrency",
        "2",
        "--wait",
        "--json",
    ]


def _rows(path: Path) -> list[dict[str, Any]]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


async def test_a_sandbox_down_for_a_while_is_retried_not_scored_0(stack: tuple[Stack, FlakySandbox]) -> None:
    s, flaky = stack
    flaky.down = 3
    code, out, err = await run_cli(*_submit(s), timeout_s=300)
    assert code == 0, err
    job = json.loads(out)
    folder = s.out / job["job_id"]
    rewards = [r["reward"] for r in _rows(folder / "rollouts.jsonl")]
    assert rewards == [1.0] * TASKS, (rewards, _rows(folder / "failures.jsonl"))
    # the three sandboxes that died were started (then more: a sandbox is started per slot, not per
    # run, where the solution's is pre-started); their runs were retried, as every reward says
    assert flaky.calls > 3


async def test_a_sandbox_that_stays_down_fails_visibly(stack: tuple[Stack, FlakySandbox]) -> None:
    s, flaky = stack
    flaky.down = -1
    code, out, err = await run_cli(*_submit(s), timeout_s=300)
    assert code == EXIT_JOB_FAILED, (code, out, err)  # every rollout failed: the job did
    assert "CHECK_FAILED" in err, err
    job = json.loads(out)
    folder = s.out / job["job_id"]
    assert _rows(folder / "rollouts.jsonl") == []  # nothing scored without a verdict
    failures = _rows(folder / "failures.jsonl")
    assert [f["error_class"] for f in failures] == ["CHECK_FAILED"] * TASKS, failures
    assert all("the sandbox did not start" in f["message"] for f in failures), failures
    metrics = json.loads((folder / "metrics.json").read_text())
    assert (metrics["num_rollouts"], metrics["failures_by_class"]) == (0, {"CHECK_FAILED": TASKS})
