"""`rollmesh up`'s process handling without the services: the child-output reader takes lines of any
length; the restart policy, its backoff and budget, and how an exit is described. The supervisor
itself, with real services, is tested in tests/e2e/test_up_faults.py."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from rollmesh.launch.processes import pump_lines
from rollmesh.launch.restart import RestartBudget
from rollmesh.launch.restart import RestartPolicy
from rollmesh.launch.restart import describe_exit
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.lines import LineWriter

FLOOD = textwrap.dedent(
    """
    import sys
    out = sys.stdout
    out.write("x" * 1_000_000 + "\\n")
    for i in range(50_000):
        out.write(f"flood {i}\\n")
    out.write("end")
    """
)


async def test_pump_takes_a_megabyte_line_and_a_flood() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOOD, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    lines: list[str] = []
    await asyncio.wait_for(pump_lines("[svc] ", proc.stdout, lines.append, 4096), 120)
    assert await proc.wait() == 0
    assert lines[0] == "[svc] " + "x" * 4096 + "...[truncated 995904 bytes]"
    assert lines[1] == "[svc] flood 0" and lines[-2] == "[svc] flood 49999"
    assert lines[-1] == "[svc] end" and len(lines) == 50_002


async def test_pump_into_a_stderr_nobody_reads_never_blocks_the_child() -> None:
    """up's path end to end: child -> pump -> LineWriter -> a full pipe. The child still finishes."""
    read_fd, write_fd = os.pipe()
    stuck = os.fdopen(write_fd, "w")
    writer = LineWriter(stuck, capacity=1000)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FLOOD, stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        await asyncio.wait_for(pump_lines("[svc] ", proc.stdout, writer.write, 4096), 120)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert writer.dropped_total > 0  # the pipe (64 KiB) and the queue filled: lines were dropped
    finally:
        os.close(read_fd)  # the blocked write fails; the writer thread ends
        writer.close(timeout_s=5)
        stuck.close()


def test_policy_modes_decide_which_exits_restart() -> None:
    assert RestartPolicy("on-failure").wants_restart(1) and RestartPolicy("on-failure").wants_restart(-9)
    assert not RestartPolicy("on-failure").wants_restart(0)
    assert RestartPolicy("always").wants_restart(0)
    assert not RestartPolicy("no").wants_restart(-9)
    with pytest.raises(ConfigError, match="not one of no, on-failure, always"):
        RestartPolicy("sometimes")


def test_policy_from_env_flags_win_over_variables() -> None:
    env = {"ROLLMESH_RESTART": "always", "ROLLMESH_RESTART_MAX": "2", "ROLLMESH_RESTART_WINDOW_S": "9"}
    assert RestartPolicy.from_env(env) == RestartPolicy("always", 2, 9.0)
    assert RestartPolicy.from_env(env, mode="no", max_restarts=7) == RestartPolicy("no", 7, 9.0)
    assert RestartPolicy.from_env({}) == RestartPolicy()


def test_budget_backs_off_exponentially_and_forgets_old_restarts() -> None:
    budget = RestartBudget(RestartPolicy(max_restarts=3, window_s=100, backoff_s=0.5, backoff_max_s=1.5))
    assert [budget.next_delay(t) for t in (0.0, 10.0, 20.0)] == [0.5, 1.0, 1.5]  # 2.0 capped at 1.5
    assert budget.next_delay(30.0) is None  # 3 restarts within 100 s: give up
    assert budget.next_delay(101.0) == 1.5  # the first (at 0.5 s) fell out of the window; two remain
    assert budget.used == 3


def test_describe_exit_names_the_code_or_the_signal() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-9) == "was killed by signal SIGKILL"
    assert describe_exit(-15) == "was killed by signal SIGTERM"


def _recording_up(monkeypatch: pytest.MonkeyPatch) -> Callable[[list[str], dict[str, str]], Any]:
    """`rollmesh up ARGS` under ENV with its mesh replaced: the `UpConfig` it would have started."""
    from typer.testing import CliRunner

    from rollmesh.cli import build_app
    from rollmesh.launch import processes

    seen: list[processes.UpConfig] = []

    class Recorder:
        def __init__(self, cfg: processes.UpConfig, write: object) -> None:
            seen.append(cfg)

        async def start(self) -> None:
            raise RuntimeError("recorded")

        async def stop(self, grace_s: float, force: asyncio.Event) -> None:
            return None

    monkeypatch.setattr(processes, "Mesh", Recorder)
    # Nothing is bound here: the ports another test's (or another mesh's) services hold do not matter.
    from rollmesh.mesh import server

    monkeypatch.setattr(server, "refuse_a_taken_port", lambda *args, **kwargs: None)

    def up_config(args: list[str], env: dict[str, str]) -> processes.UpConfig:
        res = CliRunner().invoke(build_app(), ["up", *args], env=env)
        assert res.exit_code == 1 and "failed to start: recorded" in res.output, res.output
        return seen.pop()

    return up_config


def test_up_passes_the_variables_its_flags_would_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` hands --host, --replicas and --http-port to its children as flags, so their defaults
    overrode ROLLMESH_BIND_HOST, ROLLMESH_REPLICAS and ROLLMESH_OPENAI_HTTP_PORT; a flag still wins."""
    up_config = _recording_up(monkeypatch)
    env = {"ROLLMESH_BIND_HOST": "0.0.0.0", "ROLLMESH_REPLICAS": "3", "ROLLMESH_OPENAI_HTTP_PORT": "8123"}
    for args, host, replicas, http in (
        ([], "0.0.0.0", "3", "8123"),
        (["--replicas", "2"], "0.0.0.0", "2", "8123"),
    ):
        cfg = up_config(args, env)
        gateway = dict(zip(cfg.gateway_args[::2], cfg.gateway_args[1::2], strict=True))
        assert (cfg.host, gateway["--replicas"], gateway["--http-port"]) == (host, replicas, http)


def test_up_tells_the_verifier_the_facade_port_its_judges_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier (started before the gateway) derives its judges' URL from ROLLMESH_OPENAI_HTTP_PORT:
    `up` sets it in every child to the port the gateway gets (a flag, else the variable); with
    --ephemeral (a port chosen later) to 0, and the judges are not pointed (never at port 8000)."""
    from rollmesh.verifier.config import VerifierConfig

    up_config = _recording_up(monkeypatch)
    monkeypatch.delenv("ROLLMESH_OPENAI_HTTP_PORT", raising=False)
    monkeypatch.delenv("ROLLMESH_VERIFIER_JUDGE_URL", raising=False)
    monkeypatch.delenv("ROLLMESH_GATEWAY_ADDR", raising=False)
    for args, env, url in (
        (["--http-port", "9123"], {}, "http://127.0.0.1:9123/v1"),
        ([], {"ROLLMESH_OPENAI_HTTP_PORT": "8124"}, "http://127.0.0.1:8124/v1"),
        (["--ephemeral"], {}, ""),
        (["--http-port", "-1"], {}, ""),
    ):
        cfg = up_config(args, env)
        child = {**os.environ, **env, **cfg.env}  # what processes.Mesh gives each child
        assert VerifierConfig.from_env(environ=child).judge_url == url, (args, cfg.env)
