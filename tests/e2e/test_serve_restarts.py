"""A service started again outside `rollmesh up` (a container compose restarts: `restart:
unless-stopped`) counts its restarts too: with ROLLMESH_STARTS_DIR (the compose stack sets it) each
start of `rollmesh serve` counts itself in `<service>.starts`, and the restarts before it are
exported as `rollmesh_service_restarts_total{service}` (it counted `rollmesh up`'s only, #43). What
`up` hands a child (ROLLMESH_RESTARTS) wins; a folder it cannot count in is one line, exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.metrics import metrics_file
from rollmesh.mesh.metrics import restarts_so_far
from tests.procs import ROLLMESH


def scrape_restarts(tmp_path: Path, env: dict[str, str]) -> float:
    """`rollmesh serve registry` on free ports, its restarts as its metrics endpoint exports them;
    stopped after."""
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    Path(metrics_file(str(port_file))).unlink(missing_ok=True)
    args = [str(ROLLMESH), "serve", "registry", "--port", "0", "--metrics-port", "0"]
    child_env = {**os.environ, **env, "ROLLMESH_PORT_FILE": str(port_file)}
    proc = subprocess.Popen(args, env=child_env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the registry reported no port"
            time.sleep(0.05)
        address = Path(metrics_file(str(port_file))).read_text().strip()
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as answer:
            text = answer.read().decode()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    wanted = 'rollmesh_service_restarts_total{service="registry"} '
    [line] = [ln for ln in text.splitlines() if ln.startswith(wanted)]
    return float(line.removeprefix(wanted))


def test_a_service_started_again_exports_its_restarts(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    env = {"ROLLMESH_STARTS_DIR": str(starts)}
    assert [scrape_restarts(tmp_path, env) for _ in range(3)] == [0.0, 1.0, 2.0]
    assert (starts / "registry.starts").read_text() == "3\n"
    # `rollmesh up`'s count wins (it knows), and the folder is left alone
    assert scrape_restarts(tmp_path, {**env, "ROLLMESH_RESTARTS": "7"}) == 7.0
    assert (starts / "registry.starts").read_text() == "3\n"
    assert scrape_restarts(tmp_path, {}) == 0.0  # not set: nothing counted, 0


def test_a_folder_it_cannot_count_in_is_named(tmp_path: Path) -> None:
    (tmp_path / "registry.starts").write_text("many\n")
    with pytest.raises(ConfigError, match=r"registry.starts holds 'many', not a count of starts"):
        restarts_so_far("registry", {"ROLLMESH_STARTS_DIR": str(tmp_path)})
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="ROLLMESH_STARTS_DIR: cannot count starts in"):
        restarts_so_far("registry", {"ROLLMESH_STARTS_DIR": str(tmp_path / "file")})
    done = subprocess.run(
        [str(ROLLMESH), "serve", "registry", "--port", "0"],
        env={**os.environ, "ROLLMESH_STARTS_DIR": str(tmp_path / "file")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().startswith("error: ROLLMESH_STARTS_DIR: cannot count starts in"), done.stderr
    assert "Traceback" not in done.stderr
