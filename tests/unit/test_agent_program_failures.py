"""How an external agent program's failures are told (scheduler/drivers/program.py, mesh/_confine.py): a
program that dies by its own signal is a failure naming the signal (it runs under a minimal init,
so it is not pid 1, where the kernel drops the signals it sends itself); a failed program's output
is kept as a row keeps it (the failure's `agent_program`, the failures file) and the message shows
the line that says what went wrong; and a program that overruns is AGENT_PROGRAM_TIMEOUT even when
the attempt's deadline would have come first."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from rollmesh.scheduler import convert
from rollmesh.scheduler.drivers.program import CapturedTurn
from rollmesh.scheduler.drivers.program import CaptureRecord
from rollmesh.scheduler.errors import AgentProgramExited
from rollmesh.scheduler.errors import RolloutFailed
from rollmesh.scheduler.records import RolloutFailure
from rollmesh.scheduler.records import RolloutKey
from rollmesh.scheduler.retry import with_retry
from rollmesh.scheduler.spec import RetryPolicy
from tests.fakes import LocalEnv
from tests.unit.test_external_agents import CaptureModel
from tests.unit.test_external_agents import _run
from tests.unit.test_external_agents import _turn

MODE = "uid+mount+pid+network" if os.geteuid() == 0 else "limits"


def _answered() -> CaptureModel:
    """A capture that answered one call: the program did its part, so only how it ended decides."""
    turn = _turn([1], [2], finish_reason="stop")
    turn.message = {"role": "assistant", "content": "3"}
    return CaptureModel(CaptureRecord(calls=[CapturedTurn("chat.completions", [TASK_INPUT], turn)]))


TASK_INPUT = {"role": "user", "content": "add 3"}


@pytest.mark.parametrize(
    ("code", "signal_name"),
    [
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "SIGKILL"),
        ("import signal; signal.raise_signal(signal.SIGTERM)", "SIGTERM"),
        ("import os; os.abort()", "SIGABRT"),
    ],
)
async def test_a_program_killed_by_its_own_signal_fails_naming_it(code: str, signal_name: str) -> None:
    with pytest.raises(AgentProgramExited) as exc:
        await _run(
            [sys.executable, "-c", f"print('before'); import sys; sys.stdout.flush(); {code}"], _answered()
        )
    err = exc.value
    assert f"was killed by {signal_name} after 1 model calls" in err.message
    assert err.metadata["signal"] == signal_name
    run = err.agent_program
    assert run["signal"] == signal_name and run["exit_code"] < 0 and run["sandbox"] == MODE
    assert run["stdout"] == "before\n" and run["calls"] == 1


async def test_the_program_is_not_pid_1_and_its_orphans_are_reaped() -> None:
    """Under the init (as root: a pid namespace of its own) the program is pid 2; a process it
    orphans is reaped rather than left a zombie."""
    script = (
        "import json, os, time\n"
        "r, w = os.pipe()\n"  # the orphan lives until every write end is closed
        "pr, pw = os.pipe()\n"  # its pid, from its parent
        "a = os.fork()\n"
        "if a == 0:\n"
        "    b = os.fork()\n"
        "    if b == 0:\n"
        "        os.close(w); os.read(r, 1); os._exit(0)\n"
        "    os.write(pw, str(b).encode()); os._exit(0)\n"
        "os.close(pw); os.waitpid(a, 0); b = int(os.read(pr, 32)); os.close(w); os.close(r)\n"
        "def state():\n"
        "    try:\n"
        "        return [l.split()[1] for l in open(f'/proc/{b}/status') if l.startswith('State')][0]\n"
        "    except (FileNotFoundError, ProcessLookupError, IndexError):\n"
        "        return 'gone'\n"
        "deadline = time.monotonic() + 60\n"
        "while state() != 'gone' and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(json.dumps({'pid': os.getpid(), 'ppid': os.getppid(), 'orphan': state()}))\n"
    )
    outcome = await _run([sys.executable, "-c", script], _answered())
    seen = json.loads(outcome.program["stdout"])
    assert seen["orphan"] == "gone"  # reaped, not a zombie ('Z') for the run's lifetime
    if MODE.startswith("uid"):
        assert (seen["pid"], seen["ppid"]) == (2, 1)


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "agent.py", line 3, in <module>\n'
    "    run()\n"
    "ValueError: the tool answered nothing\n"
)


async def test_a_failed_programs_output_is_kept_and_its_error_named() -> None:
    """An SDK that logs after the error ("[non-fatal] Tracing ...") hid it when only the last stderr
    line was kept; the traceback's line is the message, and both tails are kept (64 KiB each)."""
    script = (
        "import sys\n"
        "sys.stdout.write('o' * 100_000)\n"
        f"sys.stderr.write({TRACEBACK!r})\n"
        "sys.stderr.write('[non-fatal] Tracing: max retries reached, giving up on this batch.\\n')\n"
        "sys.exit(1)\n"
    )
    with pytest.raises(AgentProgramExited) as exc:
        await _run([sys.executable, "-c", script], _answered())
    err = exc.value
    assert err.message.endswith("exited with 1 after 1 model calls: ValueError: the tool answered nothing")
    run = err.agent_program
    assert run["stdout"] == "o" * 64 * 1024 and run["stdout_truncated"] is True
    assert run["stderr"].startswith(TRACEBACK) and "[non-fatal]" in run["stderr"]
    assert run["exit_code"] == 1 and run["signal"] is None

    # Through the retry loop to the failures file's row and the gRPC sink's message: the same run.
    async def attempt() -> None:
        raise err

    with pytest.raises(RolloutFailed) as failed:
        await with_retry(attempt, RetryPolicy(max_attempts=1))
    assert failed.value.error.agent_program == run
    failure = RolloutFailure(RolloutKey(0, 1), "job", "AGENT_PROGRAM_EXITED", err.message, 1, run)
    row = json.loads(json.dumps(failure.to_row()))
    assert row["agent_program"]["stderr"] == run["stderr"] and RolloutFailure.from_row(row) == failure
    assert json.loads(convert.failure_to_pb(failure).agent_program_json) == run


async def test_a_program_that_overruns_is_its_own_timeout_even_after_a_slow_start() -> None:
    """The attempt's deadline (rollout_timeout_s) and the program's (90% of it, counted from its
    start) raced: a slow start (seeding under load, here a slow environment) let the attempt's fire
    first, DEADLINE_EXCEEDED. The attempt's deadline is held while the program runs."""

    class SlowEnv(LocalEnv):
        async def seed_session(self, environment: str, task: Any, session_id: str) -> Any:
            await asyncio.sleep(1.2)  # the start a loaded host gives it: 30% of the attempt
            return await super().seed_session(environment, task, session_id)

    env = SlowEnv()

    async def attempt() -> Any:
        return await _run(["sleep", "60"], CaptureModel(), env, timeout_s=3.6)

    with pytest.raises(RolloutFailed) as failed:
        await with_retry(attempt, RetryPolicy(max_attempts=1, rollout_timeout_s=4.0))
    assert failed.value.error.name == "AGENT_PROGRAM_TIMEOUT"
    assert "ran past 3.6 s" in failed.value.error.message
    assert failed.value.error.agent_program["seconds"] >= 3.6
    assert env.closed == ["job/0/1"]
