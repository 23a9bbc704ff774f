"""A sandbox that never came up is no verdict: `Sandbox.run` raises SandboxUnavailable (the code
never ran) and the `code` environment turns it into a retryable error (CHECK_FAILED, or
CHECK_TIMEOUT when it did not start within the wall-clock limit), never a reward of 0. Whatever
the code does once the sandbox is up still ends in a verdict (its own crash scores 0)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rollmesh.verifier import SandboxConfig
from rollmesh.verifier import SandboxLimits
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.errors import CheckFailed
from rollmesh.verifier.errors import CheckTimeout
from rollmesh.verifier.errors import SandboxUnavailable
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.sandbox.core import TestSpec
from rollmesh.verifier.testing import answer
from rollmesh.verifier.testing import check
from rollmesh.verifier.testing import load_env
from rollmesh.verifier.testing import task

CODE_ENV = Path(__file__).resolve().parents[2] / "services/rollmesh/builtin/environments/code"
LIMITS = SandboxLimits(wall_s=20.0, cpu_s=4, memory_mb=256, nproc=16, fsize_mb=1, output_kb=16)
ADD = TestSpec("asserts", ["assert add(1, 2) == 3"])
HONEST = "def add(a, b):\n    return a + b\n"
# What a sandbox that fails to come up looks like from here: unshare/mount/chroot print and exit.
DIES_AT_START = ["/bin/sh", "-c", "echo 'mount: sbxroot: permission denied' >&2; exit 32"]
NEVER_ANSWERS = ["/bin/sh", "-c", "exec sleep 60"]  # a host too loaded to start it in time


async def broken(sandbox: Sandbox, argv: list[str], wall_s: float | None = None) -> Sandbox:
    """`sandbox`, its sandboxes now started by `argv` (under a wall-clock limit of `wall_s` when
    given): its pre-started ones are stopped first."""
    await sandbox.aclose()
    if wall_s is not None:
        limits = replace(sandbox.config.limits, wall_s=wall_s)
        sandbox.config = replace(sandbox.config, limits=limits)
    sandbox._command = lambda mode, root, work, limits, uid: argv  # type: ignore[method-assign]
    return sandbox


async def test_a_sandbox_that_dies_before_the_code_runs_is_no_verdict() -> None:
    sandbox = Sandbox(SandboxConfig(limits=LIMITS))
    await sandbox.start()
    with pytest.raises(SandboxUnavailable, match="permission denied") as died:
        await (await broken(sandbox, DIES_AT_START)).run(HONEST, ADD)
    assert not died.value.timed_out


async def test_a_sandbox_that_does_not_start_in_time_is_no_verdict() -> None:
    sandbox = Sandbox(SandboxConfig(limits=replace(LIMITS, wall_s=1.0)))
    await sandbox.start()
    with pytest.raises(SandboxUnavailable) as late:
        await (await broken(sandbox, NEVER_ANSWERS)).run(HONEST, ADD)
    assert late.value.timed_out


async def test_the_codes_own_crash_after_start_is_still_a_verdict() -> None:
    sandbox = Sandbox(SandboxConfig(limits=LIMITS))
    await sandbox.start()
    for code in ("import os\nos._exit(3)\n", "import os\ndef add(a, b):\n    os._exit(0)\n"):
        res = await sandbox.run(code, ADD)
        assert (res.status, res.passed) == ("crashed", 0), res
    res = await sandbox.run(HONEST, ADD)
    assert (res.status, res.passed) == ("ok", 1), res


@pytest.mark.parametrize(
    ("argv", "wall_s", "error"), [(DIES_AT_START, 20.0, CheckFailed), (NEVER_ANSWERS, 1.0, CheckTimeout)]
)
async def test_the_code_environment_fails_the_verify_instead_of_scoring_0(
    argv: list[str], wall_s: float, error: type[Exception]
) -> None:
    # The honest check runs under LIMITS' 20 s, the broken one under `wall_s`: at load 24 a real
    # sandbox did not start within 4 x 1 s, and the honest check failed instead of the broken one.
    async with load_env(CODE_ENV, VerifierConfig(sandbox=SandboxConfig(limits=LIMITS))) as env:
        good = await check(env, task(None, verifier_metadata={"tests": ADD.cases}), answer(HONEST))
        assert good.reward == 1.0, good.details
        await broken(env.sandbox, argv, wall_s)  # type: ignore[attr-defined]
        with pytest.raises(error, match="the sandbox did not start"):
            await check(env, task(None, verifier_metadata={"tests": ADD.cases}), answer(HONEST))
