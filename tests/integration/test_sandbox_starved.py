"""A sandbox run on a host whose CPUs other work holds (verifier/sandbox/clock.py): a correct
solution that waited for a CPU gets its wall-clock time and passes (a plain wall-clock limit scored
it 0); an infinite loop still ends at its CPU limit and a sleeper at the wall-clock limit (both the
code's own doing: reward 0); a run kept from a CPU past 4x the limit is SandboxStarved (no verdict).

Load is made, not hoped for: the test process is pinned to one CPU (the sandbox inherits it) with
four busy processes pinned to the same CPU, each in its own session (the kernel shares a CPU
between sessions' autogroups), so the code gets about a fifth of it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from rollmesh.verifier.config import SandboxConfig
from rollmesh.verifier.config import SandboxLimits
from rollmesh.verifier.errors import SandboxStarved
from rollmesh.verifier.sandbox.core import Sandbox
from rollmesh.verifier.sandbox.core import TestSpec

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def _work(seconds_of_cpu: float) -> str:
    """A correct `add` after a busy loop of about `seconds_of_cpu` CPU seconds."""
    return (
        "import time\n"
        f"_end = time.process_time() + {seconds_of_cpu}\n"
        "while time.process_time() < _end:\n    pass\n"
        "def add(a, b):\n    return a + b\n"
    )


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def one_busy_cpu() -> Iterator[None]:
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)], start_new_session=True) for _ in range(4)
    ]
    os.sched_setaffinity(0, {cpu})
    try:
        deadline = time.monotonic() + 60
        while not all(_cpu_seconds(p.pid) > 0.1 for p in spinners):  # each is spinning on `cpu`
            assert time.monotonic() < deadline, "the busy processes did not start"
            time.sleep(0.05)
        yield
    finally:
        os.sched_setaffinity(0, before)
        for p in spinners:
            p.kill()
            p.wait()


TESTS = TestSpec("asserts", ["assert add(2, 2) == 4"])


def _sandbox(wall_s: float, cpu_s: int, isolation: str) -> Sandbox:
    limits = SandboxLimits(wall_s=wall_s, cpu_s=cpu_s, memory_mb=512, nproc=16, fsize_mb=1, output_kb=16)
    return Sandbox(SandboxConfig(isolation=isolation, allow_unsafe_process=True, limits=limits))


@pytest.mark.parametrize("isolation", ["auto", "process"])  # auto: namespaces where the kernel allows
async def test_a_starved_correct_solution_gets_its_time_and_loops_sleepers_still_time_out(
    one_busy_cpu: None, isolation: str
) -> None:
    # 0.5 s of CPU at a fifth of one CPU: ~3 s of wall time, past the 2 s limit
    ok = await _sandbox(wall_s=2.0, cpu_s=5, isolation=isolation).run(_work(0.5), TESTS)
    assert (ok.status, ok.passed, ok.total) == ("ok", 1, 1), ok
    assert ok.duration_s > 2.0  # it did wait past the plain limit
    assert ok.cpu_wait_credit_s > 0  # and the run's report says it was given that time
    loop = await _sandbox(wall_s=3.0, cpu_s=1, isolation=isolation).run(
        "def add(a, b):\n    while True:\n        pass\n", TESTS
    )
    assert loop.status == "timeout" and loop.passed == 0 and "CPU-time" in loop.error, loop
    sleeper = await _sandbox(wall_s=1.5, cpu_s=5, isolation=isolation).run(
        "import time\ntime.sleep(30)\ndef add(a, b): return a + b\n", TESTS
    )
    assert sleeper.status == "timeout" and "wall-clock" in sleeper.error, sleeper
    assert sleeper.duration_s < 1.5 * 4  # a sleeper waits for no CPU: no extra time
    # 3 s of CPU at a fifth of one CPU needs ~15 s, and had 1.5 s of it within 4 x 1.5 s: unknown
    with pytest.raises(SandboxStarved, match="did not give the code") as starved:
        await _sandbox(wall_s=1.5, cpu_s=10, isolation=isolation).run(_work(3.0), TESTS)
    assert starved.value.timed_out  # the code environment's CHECK_TIMEOUT: retried, never a 0


# An infinite loop after forking CPU hogs that leave its session: they keep its runner from the CPU.
ESCAPED_HOGS = (
    "import posix, time\n"
    "for _ in range(4):\n"
    "    if posix.fork() == 0:\n"
    "        posix.setsid()\n"
    "        _end = time.time() + 30\n"
    "        while time.time() < _end:\n            pass\n"
    "        posix._exit(0)\n"
    "def add(a, b):\n    while True:\n        pass\n"
)


@pytest.mark.parametrize("isolation", ["auto", "process"])
async def test_hogs_the_code_forks_out_of_its_session_earn_no_time(
    one_busy_cpu: None, isolation: str
) -> None:
    """The wait they cause is the run's own doing: it ends at its wall-clock limit (reward 0). Not
    counted, they made the run look starved: it held the CPU to 4x the limit and was SandboxStarved
    (CHECK_TIMEOUT, retried, never a 0)."""
    run = await _sandbox(wall_s=1.5, cpu_s=10, isolation=isolation).run(ESCAPED_HOGS, TESTS)
    assert run.status == "timeout" and "wall-clock" in run.error, run
    assert run.duration_s < 1.5 * 2, run
