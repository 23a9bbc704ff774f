"""Rollouts/s of one agent loop run four ways, side by side in one run: rollmesh's built-in loop, and
the same chat tool loop on the plain `openai` SDK (examples/agents/tool_loop.py) as an agent server
(tool_loop_server.py, `--agent-mode server`), forked from a warm interpreter (`warm`) and started
cold per rollout (`command`). Prints one JSON object on stdout.

One embedded mesh (the `rollmesh run` process's: gateway with the fake backend playing the
`session_state` counter, verifier, scheduler) serves every job; each trial runs the four jobs one
after another in a rotating order, each `--rollouts` rollouts at `--concurrency`, and a job's
rollouts/s is its rollouts over its wall time from submit to its end. The figures are each mode's
median trial, its ratio to the built-in loop's (the target: server and warm >= 0.5), the same
from the time a fifth of a job's rollouts were done to its end (`steady_*`: without the start of a
job's agent server or warm interpreter, which every job pays once in its wall time), the
seconds from submit to its first rollout done, the CPU spent per rollout by the mesh (this
process) and by the programs (its children), and the load average before and after.

A job is 2000 rollouts by default: a training job's pass over its rows (250 tasks x 8 samples),
not a handful. With the fake model a built-in rollout costs ~2.5 ms of CPU, so a job of 200 lasted
~0.5 s and every mode's whole-job figure was mostly its start (a server's or warm interpreter's
0.7-1 s); with a real model a rollout takes seconds and the start is smaller still. `--rollouts
200` gives the earlier setting.

    python bench/agent_programs.py [--rollouts 2000] [--cold-rollouts 40] [--trials 2] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench._meta import cpu_by_process  # noqa: E402
from bench._meta import env_info  # noqa: E402
from bench._meta import log  # noqa: E402
from bench._meta import result_stream  # noqa: E402

DATA = REPO / "services/rollmesh/builtin/environments/session_state/data/example.jsonl"
AGENTS = REPO / "examples" / "agents"
MODES = {
    "builtin": ("", []),
    "server": ("server", [sys.executable, str(AGENTS / "tool_loop_server.py")]),
    "warm": ("warm", [sys.executable, str(AGENTS / "tool_loop.py")]),
    "command": ("command", [sys.executable, str(AGENTS / "tool_loop.py")]),
}


def _own_cpu_s() -> float:
    """CPU seconds of this process: the mesh (gateway, verifier, scheduler)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _reaped_cpu_s() -> float:
    """CPU seconds of this process's children it reaped, with what they reaped in turn."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return reaped.ru_utime + reaped.ru_stime


class _ProgramsCpu:
    """CPU seconds of this process's descendants (the programs: per-rollout processes, a warm
    interpreter and the rollouts it forks, an agent server) during a job, each counted once: a
    sample is every live descendant's CPU with what it reaped (a process that ended is in its
    reaper's figure, never also on its own) plus what this process reaped since the job began; the
    job's figure is its largest sample, taken every `period_s` and until its descendants are gone
    after its end. What a process spends after the last sample is missed only when no descendant
    reaped it (a stopped agent server's processes: their parent is killed with them)."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period_s = period_s
        self.before = self._now()  # (what ran before the job: not its CPU)
        self.reaped = _reaped_cpu_s()
        self.best = 0.0

    @staticmethod
    def _now() -> dict[tuple[int, float], float]:
        found = cpu_by_process(lambda name, cmd: name, tree_of=os.getpid(), reaped=True)
        return {key: cpu for key, (_, cpu) in found.items() if key[0] != os.getpid()}

    def _sample(self) -> int:
        """One sample; how many of the job's processes are alive."""
        now = self._now()
        alive = sum(cpu - self.before.get(key, 0.0) for key, cpu in now.items())
        self.best = max(self.best, alive + _reaped_cpu_s() - self.reaped)
        return sum(1 for key in now if key not in self.before)

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self._sample)
            await asyncio.sleep(self.period_s)

    async def finish(self, timeout_s: float = 5.0) -> None:
        """Samples after the job's end until its processes are gone (and reaped)."""
        deadline = time.monotonic() + timeout_s
        while await asyncio.to_thread(self._sample) and time.monotonic() < deadline:  # noqa: ASYNC110 - polling /proc
            await asyncio.sleep(0.05)

    def total(self) -> float:
        return self.best


async def _watched(handle: Any, t0: float) -> tuple[Any, float, float]:
    """The job's end, polled every 50 ms: (its final Job, seconds from submit to its first rollout
    done, its rollouts/s from the time a fifth were done to its end)."""
    from rollmesh_client._scheduler import FINAL_STATES

    first_s, mark = 0.0, None
    while True:
        job = await handle.get()
        now, done = time.perf_counter(), job.progress.succeeded + job.progress.failed
        if done and not first_s:
            first_s = now - t0
        if mark is None and done * 5 >= job.progress.total > 0:
            mark = (now, done)
        if job.state in FINAL_STATES:
            break
        await asyncio.sleep(0.05)
    if mark is None or done <= mark[1]:
        return job, first_s, 0.0
    return job, first_s, (done - mark[1]) / (now - mark[0])


async def _trials(args: argparse.Namespace, out: Path) -> dict[str, list[dict[str, float]]]:
    from rollmesh.gateway.config import GatewayConfig
    from rollmesh.launch import embedded_mesh
    from rollmesh.mesh.config import ServerConfig
    from rollmesh.mesh.logging import configure
    from rollmesh_client import Client
    from rollmesh_client.v1 import scheduler_pb2 as pb

    configure(level="warning", json=True)
    os.environ["ROLLMESH_FAKE_SCRIPT"] = "rollmesh.devtools.fake_scripts:counter_agent"
    cfg = GatewayConfig.from_env(server=ServerConfig(), http_port=-1, backend="fake")
    rows = sum(1 for _ in DATA.open())
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES if m in args.modes}
    order = [m for m in MODES if m in args.modes]
    async with embedded_mesh(cfg, output_dir=str(out)) as mesh:
        async with await Client.connect(**mesh.addresses, timeout_s=600) as c:
            for trial in range(args.trials + 1):  # the first is a warm-up, not kept
                for mode in order[trial % len(order) :] + order[: trial % len(order)]:
                    program_mode, argv = MODES[mode]
                    n = args.cold_rollouts if mode == "command" else args.rollouts
                    spec = pb.JobSpec(
                        dataset=str(DATA),
                        environment="session_state",
                        num_repeats=max(1, n // rows),
                        concurrency=args.concurrency,
                        output_dir=str(out),
                        agent=pb.AgentSpec(program=argv, program_mode=program_mode),
                    )
                    programs = _ProgramsCpu()
                    sampler = asyncio.create_task(programs.run())
                    cpu0, t0 = _own_cpu_s(), time.perf_counter()
                    try:
                        job, first_s, steady = await _watched(await c.scheduler.submit(spec), t0)
                    finally:
                        sampler.cancel()
                    wall, mesh_cpu = time.perf_counter() - t0, _own_cpu_s() - cpu0
                    await programs.finish()
                    cpu = (mesh_cpu, programs.total())
                    done = job.progress.succeeded
                    if job.progress.failed or not done:
                        raise SystemExit(f"{mode}: {job.progress.failed} rollouts failed: {job.error}")
                    figures = {
                        "rollouts_per_s": done / wall,
                        "steady_rollouts_per_s": steady,
                        "first_rollout_s": first_s,
                        "mesh_cpu_ms_per_rollout": cpu[0] * 1000 / done,
                        "programs_cpu_ms_per_rollout": cpu[1] * 1000 / done,
                    }
                    log(
                        "trial",
                        n=trial,
                        mode=mode,
                        rollouts=done,
                        **{k: round(v, 2) for k, v in figures.items()},
                    )
                    if trial:
                        results[mode].append(figures)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rollouts", type=int, default=2000, help="rollouts per job (built-in, server, warm)"
    )
    parser.add_argument("--cold-rollouts", type=int, default=40, help="rollouts per cold (command) job")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--modes", default=",".join(MODES), help="which of builtin,server,warm,command")
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    out_stream = result_stream()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as tmp:
        results = asyncio.run(_trials(args, Path(tmp)))
    median = {
        mode: {k: round(statistics.median(t[k] for t in trials), 2) for k in trials[0]}
        for mode, trials in results.items()
    }
    builtin = median.get("builtin", {}).get("rollouts_per_s", 0.0) or float("nan")
    steady_builtin = median.get("builtin", {}).get("steady_rollouts_per_s", 0.0) or float("nan")
    out: dict[str, Any] = {
        "bench": "agent_programs",
        "rollouts": args.rollouts,
        "cold_rollouts": args.cold_rollouts,
        "trials": args.trials,
        "concurrency": args.concurrency,
        "rollouts_per_s": {m: v["rollouts_per_s"] for m, v in median.items()},
        "vs_builtin": {m: round(v["rollouts_per_s"] / builtin, 3) for m, v in median.items()},
        "steady_rollouts_per_s": {m: v["steady_rollouts_per_s"] for m, v in median.items()},
        "steady_vs_builtin": {
            m: round(v["steady_rollouts_per_s"] / steady_builtin, 3) for m, v in median.items()
        },
        "first_rollout_s": {m: v["first_rollout_s"] for m, v in median.items()},
        "mesh_cpu_ms_per_rollout": {m: v["mesh_cpu_ms_per_rollout"] for m, v in median.items()},
        "programs_cpu_ms_per_rollout": {m: v["programs_cpu_ms_per_rollout"] for m, v in median.items()},
        "trials_rollouts_per_s": {
            m: [round(t["rollouts_per_s"], 2) for t in ts] for m, ts in results.items()
        },
        "target": "server and warm >= 0.5 x builtin",
        "target_met": all(
            median[m]["rollouts_per_s"] >= 0.5 * builtin for m in ("server", "warm") if m in median
        ),
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        **env_info("openai"),
    }
    out_stream.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
