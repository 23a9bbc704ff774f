"""How a job's agent program runs (scheduler/drivers/modes.py) and automatic concurrency bounded by
the host's CPU for jobs of agent programs (scheduler/concurrency.py `HostCpu`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollmesh.scheduler.concurrency import HostCpu
from rollmesh.scheduler.concurrency import Limiter
from rollmesh.scheduler.drivers.modes import check_mode
from rollmesh.scheduler.drivers.modes import warm_argv


def test_the_modes_and_what_a_warm_start_can_run() -> None:
    assert check_mode("", ()) == "command" and check_mode("server", ("prog",)) == "server"
    assert warm_argv(["/v/bin/python3", "-u", "agent.py", "--x"]) == ("/v/bin/python3", ["agent.py", "--x"])
    assert warm_argv(["python", "-m", "pkg.agent"]) == ("python", ["-m", "pkg.agent"])
    assert warm_argv(["python3.11", "-c", "print(1)", "a"]) == ("python3.11", ["-c", "print(1)", "a"])
    with pytest.raises(ValueError, match="not one of command, warm, server"):
        check_mode("fast", ("python", "a.py"))
    with pytest.raises(ValueError, match="needs an agent program"):
        check_mode("server", ())
    for argv in (["node", "agent.js"], ["python"], ["python", "-m"], ["python", "-X", "dev", "a.py"]):
        with pytest.raises(ValueError, match="a warm start needs"):
            check_mode("warm", argv)


def _stat(path: Path, busy: int, idle: int, running: int) -> None:
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 0 0 1\nprocs_running {running + 1}\n")


def _windows(lim: Limiter, n: int, latency: float = 0.1) -> None:
    for _ in range(n * max(8, min(lim.limit, 256))):
        lim.observe(latency)


def test_a_program_job_grows_while_the_cores_have_room_holds_when_busy_and_cuts_when_over(
    tmp_path: Path,
) -> None:
    stat = tmp_path / "stat"
    _stat(stat, 0, 0, 0)
    cpu = HostCpu(stat, cores=2)
    lim = Limiter(4, adaptive=True, clock=lambda: 0.0, cpu=cpu)
    _stat(stat, 50, 950, 1)  # 5 % busy since the last look
    _windows(lim, 1)
    assert lim.limit == 8
    _stat(stat, 1050, 1000, 3)  # the next look: 1000 busy of 1050 jiffies
    _windows(lim, 1)
    assert lim.limit == 8  # full: held, whatever the latency says
    _stat(stat, 1100, 1950, 5)  # more runnable than two per core: cut
    _windows(lim, 1)
    assert lim.limit == 5
    for n in range(4):  # the host stays over (its other work): no lower than where the job started
        _stat(stat, 1200 + 100 * n, 2000 + 100 * n, 9)
        _windows(lim, 1)
    assert lim.limit == 4
    assert HostCpu(tmp_path / "none", cores=2).state() == ""  # no /proc/stat: never busy
