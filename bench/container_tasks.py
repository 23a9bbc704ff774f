"""Oracle trials of a trivial Harbor task per second, by machine provider. Prints ONE JSON object to
stdout; logs go to stderr.

    .venv/bin/python bench/container_tasks.py [--trials 60] [--concurrency 4] [--providers daemonless]

A trial is what `rollmesh run --oracle` does for one rollout, through the verifier service in this
process (no gRPC): seed (the rollout's machine starts; the image is built before timing starts),
the oracle's solve.sh, the task's test.sh, the verdict read, the machine removed. Figures per
provider: trials/s, machine start p50/p95 (the seed), CPU ms per trial by process kind (this
process without the memory sampler's thread, the machines; for Docker, the daemon's dockerd and
containerd too) and the peak memory of this process and everything under it (sampled).
`--harbor VENV` also times Harbor's own `harbor run` (oracle agent, docker environment) on the same
task in that virtualenv, where a Docker daemon answers; what blocked it otherwise is reported.
`--docker-loop` times the plain Docker loop a Harbor oracle trial comes down to, as its stand-in
where Harbor cannot run: `docker run -d`, `docker cp` the solution, `docker exec` solve.sh,
`docker cp` the tests, `docker exec` test.sh, `docker exec cat` the reward, `docker rm -f`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._meta import cpu_by_process
from bench._meta import cpu_ms_per
from bench._meta import env_info
from bench._meta import result_stream
from rollmesh.mesh.chat import ToolCall
from rollmesh.mesh.logging import configure
from rollmesh.mesh.oracle import ORACLE_ROW_KEY
from rollmesh.mesh.oracle import ORACLE_TOOL
from rollmesh.registry import Catalog
from rollmesh.registry import Root
from rollmesh.verifier import Response
from rollmesh.verifier import VerifierConfig
from rollmesh.verifier.service import VerifierService
from rollmesh.verifier.service import VerifyCall

ENV = "bench_tasks"
TASK = "trivial"
BASE = "rollmesh-base:bookworm"


def write_task(root: Path, provider: str, warm: int = 0) -> Path:
    """An artifact root with `environments/bench_tasks/` holding one trivial task; its tasks folder."""
    folder = root / "environments" / ENV
    task = folder / "tasks" / TASK
    for sub in ("environment", "tests", "solution"):
        (task / sub).mkdir(parents=True, exist_ok=True)
    (folder / "container_tasks.toml").write_text(f'tasks = "tasks"\nprovider = "{provider}"\nwarm = {warm}\n')
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[agent]\ntimeout_sec = 60.0\n\n[verifier]\ntimeout_sec = 60.0\n'
    )
    (task / "instruction.md").write_text("Write hello to /app/out.txt.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {BASE}\nWORKDIR /app\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\necho hello > /app/out.txt\n")
    (task / "tests" / "test.sh").write_text(
        '#!/bin/sh\nif [ "$(cat /app/out.txt)" = hello ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )
    for script in (task / "solution" / "solve.sh", task / "tests" / "test.sh"):
        script.chmod(0o755)
    return folder / "tasks"


class PeakMemory:
    """The largest RSS sum of this process and its descendants, sampled every 100 ms. The sampling
    costs this process CPU (walking /proc: ~2.5 ms a sample here), which is not a trial's: its
    thread's CPU time is `cpu_s`, taken off this process's figure (`own_cpu`)."""

    def __init__(self) -> None:
        self.peak = 0
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil  # type: ignore[import-untyped]

        me = psutil.Process()
        while not self._stop.wait(0.1):
            total = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    continue
            self.peak = max(self.peak, total)
            self.cpu_s = time.thread_time()

    def own_cpu(self, cpu_ms: dict[str, float], label: str, trials: int) -> dict[str, float]:
        """`cpu_ms` (per trial, by label) without the sampling's CPU in `label`."""
        if label not in cpu_ms:
            return cpu_ms
        return {**cpu_ms, label: round(max(0.0, cpu_ms[label] - self.cpu_s * 1e3 / trials), 2)}


def _label(name: str, cmdline: str) -> str:
    """The machines (the factory, whose reaped children are every machine's keeper and what ran in
    it) apart from this process (the verifier)."""
    return "machines" if "_machine.py" in cmdline else "verifier"


async def run_provider(provider: str, trials: int, concurrency: int, root: Path, warm: int) -> dict[str, Any]:
    write_task(root, provider, warm if provider == "daemonless" else 0)
    service = VerifierService.from_catalog(
        VerifierConfig(), Catalog([Root(root, 0, "bench")]), entry_points=False
    )
    await service.start()
    try:
        env = service.environment(ENV)
        problem = env.problem()
        if problem:
            return {"provider": provider, "error": problem}
        row = json.dumps({**env.tasks[TASK].row(), ORACLE_ROW_KEY: True})  # type: ignore[attr-defined]
        starts: list[float] = []
        gate = asyncio.Semaphore(concurrency)

        async def trial(i: int) -> None:
            async with gate:
                began = time.perf_counter()
                sid = (await service.seed_session(ENV, row, f"bench/{i}/0")).session.id
                starts.append(time.perf_counter() - began)
                try:
                    await service.call_tool(sid, ToolCall("o", ORACLE_TOOL, "{}"))
                    verdict = await service.verify(VerifyCall(ENV, row, Response(), sid))
                finally:
                    await service.close_session(sid)
                if verdict.reward != 1.0:
                    raise RuntimeError(f"trial {i} scored {verdict.reward}: {verdict.details}")

        await trial(-1)  # the image is built (and cached) here, outside the timing
        starts.clear()
        cpu_before = cpu_by_process(_label, tree_of=os.getpid(), reaped=True)
        daemon = DaemonCpu() if provider == "docker" else None
        with PeakMemory() as memory:
            began = time.perf_counter()
            await asyncio.gather(*(trial(i) for i in range(trials)))
            elapsed = time.perf_counter() - began
        starts.sort()
        return {
            "provider": provider + (f" (warm {warm})" if warm and provider == "daemonless" else ""),
            "trials": trials,
            "concurrency": concurrency,
            "trials_per_s": round(trials / elapsed, 2),
            "machine_start_p50_ms": round(statistics.median(starts) * 1e3, 1),
            "machine_start_p95_ms": round(starts[min(len(starts) - 1, int(len(starts) * 0.95))] * 1e3, 1),
            "cpu_ms_per_trial": memory.own_cpu(
                cpu_ms_per(_label, cpu_before, trials, tree_of=os.getpid(), reaped=True), "verifier", trials
            ),
            "peak_memory_mb": round(memory.peak / 2**20, 1),
            **({"daemon_cpu_ms_per_trial": daemon.per(trials)} if daemon is not None else {}),
        }
    finally:
        await service.aclose()


def _seconds(start: str, end: str) -> float:
    """Seconds between two of Harbor's ISO-8601 timestamps."""
    parse = datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def run_harbor(venv: Path, trials: int, concurrency: int, root: Path) -> dict[str, Any]:
    """Harbor's `harbor run` with its oracle agent and docker environment on the same task (its own
    virtualenv); trials/s over the whole command. What blocked it, when it could not run."""
    harbor = venv / "bin" / "harbor"
    if not harbor.exists():
        return {
            "provider": "harbor",
            "error": f"no {harbor}: make Harbor's virtualenv (docs/results/benchmarks/container_tasks.md)",
        }
    tasks = write_task(root, "daemonless")
    jobs = root / "harbor-jobs"
    argv = [str(harbor), "run", "--path", str(tasks), "--agent", "oracle", "--env", "docker"]
    # One untimed trial first, in its own jobs folder: Harbor builds the task's image then, as the
    # providers build theirs before timing starts.
    warm = [*argv, "--n-attempts", "1", "--n-concurrent", "1", "--jobs-dir", str(root / "harbor-warmup")]
    warmed = subprocess.run(warm, capture_output=True, text=True, timeout=1800, check=False)
    if warmed.returncode != 0:
        tail = (warmed.stderr or warmed.stdout).strip().splitlines()[-3:]
        return {
            "provider": "harbor",
            "error": f"harbor run (warm-up) exited {warmed.returncode}: {' | '.join(tail)[-600:]}",
        }
    argv += ["--n-attempts", str(trials), "--n-concurrent", str(concurrency), "--jobs-dir", str(jobs)]
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {
            "provider": "harbor",
            "error": f"harbor run exited {done.returncode}: {' | '.join(tail)[-600:]}",
        }
    trials_found = [json.loads(p.read_text()) for p in jobs.glob("*/*/result.json")]
    failed = [t["exception_info"]["exception_message"] for t in trials_found if t.get("exception_info")]
    if failed:
        return {
            "provider": "harbor",
            "error": f"{len(failed)} of {len(trials_found)} trials failed; the first: {failed[0][:700]}",
        }
    rewards = [(t.get("verifier_result") or {}).get("rewards", {}).get("reward") for t in trials_found]
    phases: dict[str, list[float]] = {
        name: [] for name in ("environment_setup", "agent_execution", "verifier", "after_verifier")
    }
    for t in trials_found:
        for name in ("environment_setup", "agent_execution", "verifier"):
            if isinstance(t.get(name), dict):
                phases[name].append(_seconds(t[name]["started_at"], t[name]["finished_at"]))
        if isinstance(t.get("verifier"), dict) and t.get("finished_at"):
            phases["after_verifier"].append(_seconds(t["verifier"]["finished_at"], t["finished_at"]))
    scored = [r for r in rewards if r is not None]
    return {
        "provider": "harbor",
        "trials": trials,
        "concurrency": concurrency,
        "trials_per_s": round(trials / elapsed, 2),
        "trials_scored_1": sum(1 for r in scored if r == 1),
        # Harbor's own per-trial phase times (result.json), medians in seconds; after_verifier is its
        # tear-down (`docker compose down`) up to the trial's end.
        "phase_p50_s": {name: round(statistics.median(v), 2) for name, v in phases.items() if v},
        "command": " ".join(argv[1:]),
    }


async def _docker(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])}: {err.decode(errors='replace').strip()[-300:]}")
    return out.decode().strip()


async def run_docker_loop(trials: int, concurrency: int, root: Path) -> dict[str, Any]:
    """The plain Docker loop of a Harbor oracle trial (module doc), on the same task and image."""
    task = write_task(root, "docker") / TASK
    image = "rollmesh-bench-trivial:latest"
    await _docker("build", "-q", "--network", "host", "-t", image, str(task / "environment"))
    starts: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def trial() -> None:
        async with gate:
            began = time.perf_counter()
            cid = await _docker("run", "-d", "--network", "none", image, "sleep", "infinity")
            starts.append(time.perf_counter() - began)
            try:
                await _docker("cp", f"{task / 'solution'}/.", f"{cid}:/solution")
                await _docker("exec", cid, "sh", "-c", "chmod +x /solution/solve.sh && /solution/solve.sh")
                await _docker("exec", cid, "mkdir", "-p", "/logs/verifier", "/tests")
                await _docker("cp", f"{task / 'tests'}/.", f"{cid}:/tests")
                await _docker("exec", cid, "sh", "-c", "chmod +x /tests/test.sh && /tests/test.sh")
                reward = await _docker("exec", cid, "cat", "/logs/verifier/reward.txt")
            finally:
                await _docker("rm", "-f", cid)
            if reward != "1":
                raise RuntimeError(f"a docker-loop trial scored {reward!r}")

    await trial()
    starts.clear()
    cpu_before = cpu_by_process(_cli_label, tree_of=os.getpid(), reaped=True)
    daemon = DaemonCpu()
    began = time.perf_counter()
    await asyncio.gather(*(trial() for _ in range(trials)))
    elapsed = time.perf_counter() - began
    starts.sort()
    return {
        "provider": "docker-loop (Harbor's oracle trial as plain docker calls)",
        "trials": trials,
        "concurrency": concurrency,
        "trials_per_s": round(trials / elapsed, 2),
        "machine_start_p50_ms": round(statistics.median(starts) * 1e3, 1),
        "machine_start_p95_ms": round(starts[min(len(starts) - 1, int(len(starts) * 0.95))] * 1e3, 1),
        "cpu_ms_per_trial": cpu_ms_per(_cli_label, cpu_before, trials, tree_of=os.getpid(), reaped=True),
        "daemon_cpu_ms_per_trial": daemon.per(trials),
    }


def _cli_label(name: str, cmdline: str) -> str:
    """This process and the docker CLI commands it ran (reaped: counted as its own)."""
    return "bench+docker_cli"


def _daemon_label(name: str, cmdline: str) -> str:
    return "daemon"


def _daemon_pid() -> int | None:
    """The Docker daemon that DOCKER_HOST names (its socket on its command line), else the only one."""
    import psutil

    socket_path = os.environ.get("DOCKER_HOST", "").removeprefix("unix://")
    found = [p for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] == "dockerd"]
    mine = [p for p in found if socket_path and socket_path in " ".join(p.info["cmdline"] or [])]
    chosen = mine or (found if len(found) == 1 else [])
    return int(chosen[0].pid) if chosen else None


class DaemonCpu:
    """The CPU the Docker daemon (dockerd and its containerd; not the per-container shims, which
    belong to init) spends over a timed section, per trial."""

    def __init__(self) -> None:
        self.pid = _daemon_pid()
        self.before = cpu_by_process(_daemon_label, tree_of=self.pid) if self.pid else {}

    def per(self, trials: int) -> Any:
        if self.pid is None:
            return "no dockerd found"
        return cpu_ms_per(_daemon_label, self.before, trials, tree_of=self.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--providers", default="daemonless")
    parser.add_argument("--harbor", type=Path, default=None, help="Harbor's virtualenv (harbor 0.25)")
    parser.add_argument("--docker-loop", action="store_true", help="time the plain Docker loop too")
    parser.add_argument("--warm", type=int, default=0, help="daemonless: machines started ahead per task")
    args = parser.parse_args()
    configure(level="WARNING")
    out = result_stream()
    results = []
    for provider in [p for p in args.providers.split(",") if p]:
        with tempfile.TemporaryDirectory(prefix="rollmesh-bench-") as tmp:
            results.append(
                asyncio.run(run_provider(provider, args.trials, args.concurrency, Path(tmp), args.warm))
            )
    if args.docker_loop:
        with tempfile.TemporaryDirectory(prefix="rollmesh-bench-loop-") as tmp:
            results.append(asyncio.run(run_docker_loop(args.trials, args.concurrency, Path(tmp))))
    if args.harbor is not None:
        with tempfile.TemporaryDirectory(prefix="rollmesh-bench-harbor-") as tmp:
            results.append(run_harbor(args.harbor, args.trials, args.concurrency, Path(tmp)))
    load = os.getloadavg()
    json.dump(
        {"env": env_info("rollmesh"), "load_avg_1m": round(load[0], 2), "results": results}, out, indent=2
    )
    out.write("\n")


if __name__ == "__main__":
    main()
