"""What every benchmark shares: the JSON's environment (CPUs, package versions, git sha), event
lines on stderr, where the machine's CPU went, by process, a figure's mean and stddev over trials,
and a module of scripts/ (the foreign virtualenvs' builders) loaded by path."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent


def trial_args(doc: str, *, trials: int = 5, steps: int = 500) -> argparse.Namespace:
    """The command line of a bench that alternates paths over trials of N steps: `--trials`,
    `--steps` (its description: the first paragraph of `doc`, the script's docstring)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=trials)
    ap.add_argument("--steps", type=int, default=steps)
    return ap.parse_args()


def result_stream() -> TextIO:
    """Where the benchmark's one JSON object goes: the original stdout. From this call on, fd 1
    points at stderr, so what Ray, vLLM and their child processes print (raylet messages, even at
    exit) never mixes with the result."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(saved, "w", buffering=1)


def env_info(*dists: str) -> dict[str, Any]:
    """{"cpus", "versions" (python + each distribution, "" when not installed), "git_sha"}."""
    versions = {"python": platform.python_version()}
    for dist in dists:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = ""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return {"cpus": os.cpu_count(), "versions": versions, "git_sha": sha}


def stats(values: list[float]) -> dict[str, float]:
    """A figure over trials: its mean and sample stddev (0 for one trial)."""
    return {"mean": statistics.fmean(values), "stddev": statistics.stdev(values) if len(values) > 1 else 0.0}


def step_figures(wall: dict[str, list[float]], cpu: dict[str, list[float]], cpu_label: str) -> dict[str, Any]:
    """A per-step bench's figures for each path: wall µs per step (`stats` over trials), the best
    trial (the least disturbed: a shared machine's load only ever adds time) and `<cpu_label>` µs per
    step."""
    return {
        "wall_us_per_step": {k: stats(v) for k, v in wall.items()},
        "best_wall_us_per_step": {k: min(v) for k, v in wall.items()},
        f"{cpu_label}_us_per_step": {k: stats(v) for k, v in cpu.items()},
    }


def load_script(name: str) -> Any:
    """scripts/NAME.py (not a package), loaded by path: e.g. `load_script("openenv_venv").venv()`."""
    path = REPO / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_scripts_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log(event: str, **fields: Any) -> None:
    """One JSON event line on stderr (stdout carries only the result)."""
    print(json.dumps({"event": event, **fields}), file=sys.stderr, flush=True)


CpuSnapshot = dict[tuple[int, float], tuple[str, float]]  # (pid, start time) -> (label, CPU s)


def cpu_by_process(
    label: Callable[[str, str], str], *, tree_of: int | None = None, reaped: bool = False
) -> CpuSnapshot:
    """CPU seconds (user + system) so far of every process on the machine, each with its
    `label(process name, command line)`, keyed by the process (pid and start time): a process
    whose title changes meanwhile (a Ray actor names the method it runs) is still the same
    process. `tree_of`: only that process and its descendants (a local Ray's GCS, raylet,
    workers and the engines they spawn descend from the driver), so other work on a shared
    machine (another Ray cluster's processes of the same name) is not counted. `reaped`: a
    process's CPU includes its children's that it reaped (short-lived ones: a sandbox per run)."""
    import psutil  # type: ignore[import-untyped]

    if tree_of is None:
        procs = list(psutil.process_iter())
    else:
        root = psutil.Process(tree_of)
        procs = [root, *root.children(recursive=True)]
    out: CpuSnapshot = {}
    for proc in procs:
        try:
            info = proc.as_dict(["name", "cmdline", "cpu_times", "create_time"])
        except psutil.Error:  # it ended meanwhile
            continue
        times = info["cpu_times"]
        if times is None:
            continue
        name = label(str(info["name"] or "?"), " ".join(info["cmdline"] or []))
        cpu = times.user + times.system + (times.children_user + times.children_system if reaped else 0.0)
        out[(proc.pid, float(info["create_time"] or 0.0))] = (name, cpu)
    return out


def cpu_ms_per(
    label: Callable[[str, str], str],
    before: CpuSnapshot,
    items: int,
    *,
    per: int = 1,
    floor_ms: float = 0.1,
    digits: int = 2,
    tree_of: int | None = None,
    reaped: bool = False,
) -> dict[str, float]:
    """CPU ms per `per` items that each process spent since `before` (a `cpu_by_process(label,
    tree_of=..., reaped=...)` with the same both; a process started since counts from 0), summed by
    label, the largest first; labels under `floor_ms` are left out."""
    spent: dict[str, float] = {}
    for key, (name, cpu_s) in cpu_by_process(label, tree_of=tree_of, reaped=reaped).items():
        delta = cpu_s - before.get(key, (name, 0.0))[1]
        spent[name] = spent.get(name, 0.0) + delta * 1e3 * per / max(items, 1)
    return {k: round(v, digits) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= floor_ms}
