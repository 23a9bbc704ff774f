"""What every benchmark shares: the JSON's environment (CPUs, package versions, git sha), event
lines on stderr, and where the machine's CPU went, by process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


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


def log(event: str, **fields: Any) -> None:
    """One JSON event line on stderr (stdout carries only the result)."""
    print(json.dumps({"event": event, **fields}), file=sys.stderr, flush=True)


def cpu_by_process(label: Callable[[str, str], str], *, tree_of: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) so far of every process on the machine, summed by
    `label(process name, command line)`. `tree_of`: only that process and its descendants (a
    local Ray's GCS, raylet, workers and the engines they spawn descend from the driver), so
    other work on a shared machine (another Ray cluster's processes of the same name) is not
    counted."""
    import psutil  # type: ignore[import-untyped]

    out: dict[str, float] = {}
    if tree_of is None:
        procs = list(psutil.process_iter(["name", "cmdline", "cpu_times"]))
    else:
        root = psutil.Process(tree_of)
        procs = [root, *root.children(recursive=True)]
        for proc in procs:
            try:
                proc.info = proc.as_dict(["name", "cmdline", "cpu_times"])
            except psutil.Error:  # it ended meanwhile
                proc.info = {"name": "?", "cmdline": [], "cpu_times": None}
    for proc in procs:
        times = proc.info["cpu_times"]
        if times is None:
            continue
        key = label(str(proc.info["name"] or "?"), " ".join(proc.info["cmdline"] or []))
        out[key] = out.get(key, 0.0) + times.user + times.system
    return out


def cpu_ms_per(
    label: Callable[[str, str], str],
    before: dict[str, float],
    items: int,
    *,
    per: int = 1,
    floor_ms: float = 0.1,
    digits: int = 2,
    tree_of: int | None = None,
) -> dict[str, float]:
    """CPU ms per `per` items spent since `before` (a `cpu_by_process(label, tree_of=...)` with the
    same `tree_of`), by label, the largest first; labels under `floor_ms` are left out."""
    after = cpu_by_process(label, tree_of=tree_of)
    spent = {k: (v - before.get(k, 0.0)) * 1e3 * per / max(items, 1) for k, v in after.items()}
    return {k: round(v, digits) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= floor_ms}
