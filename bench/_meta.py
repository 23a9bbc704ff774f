"""What every benchmark's JSON carries besides its figures: CPUs, package versions, git sha."""

from __future__ import annotations

import os
import platform
import subprocess
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
