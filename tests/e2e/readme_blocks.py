"""The README's (or a docs page's) shell blocks as tests run them: a block after a heading or
phrase, its default ports mapped to a running mesh's addresses, run by bash with the venv's grpcurl
and rollmesh first on PATH."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from rollmesh.mesh.config import DEFAULT_PORTS
from tests.procs import GRPCURL

README = Path(__file__).resolve().parents[2] / "README.md"
DOCS = README.parent / "docs"


def pages() -> list[Path]:
    """The README and every page of the docs site (docs/*.md)."""
    return [README, *sorted(DOCS.glob("*.md"))]


def bash_block(after: str, doc: Path = README) -> str:
    """The first ```bash block of `doc` (README.md) after the text `after`."""
    section = doc.read_text().split(after, 1)[1]
    return re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0]


def run_block(
    script: str,
    addrs: Mapping[str, str],
    tmp: Path,
    env: Mapping[str, str] | None = None,
    *,
    cwd: Path | None = None,
    timeout_s: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run `script` (`set -e`: it stops at the first command that fails) against the mesh at `addrs`
    (empty: a block that starts its own mesh), in `cwd` (default: the test's)."""
    for service, port in DEFAULT_PORTS.items():
        if service in addrs:
            script = script.replace(f"127.0.0.1:{port}", addrs[service])
    assert not re.search(r"127\.0\.0\.1:5005\d", script), "a README command uses a port the test does not map"
    path = tmp / "readme_block.sh"
    path.write_text("set -e\n" + script)
    full_env = {**os.environ, **(env or {}), "PATH": f"{GRPCURL.parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(path)], capture_output=True, text=True, env=full_env, timeout=timeout_s, cwd=cwd
    )
