"""Shared e2e fixtures: one `rollmesh up` mesh (separate processes, fake model backend) for the package."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.procs import ROLLMESH


@contextmanager
def rollmesh_up(
    work: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
) -> Iterator[dict[str, Any]]:
    """`rollmesh up --ephemeral --backend fake [args]` in `work` (with `env` added); yields what it
    prints (the addresses) once every service is up, and checks it stops cleanly on SIGINT."""
    out, log = work / "up.json", work / "up.log"
    with out.open("w") as o, log.open("w") as e:
        proc = subprocess.Popen(
            [
                str(ROLLMESH),
                "up",
                "--ephemeral",
                "--backend",
                "fake",
                "--json",
                "--output-dir",
                str(work / "runs"),
                *args,
            ],
            stdout=o,
            stderr=e,
            cwd=work,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while not out.read_text().strip().endswith("}"):
            assert proc.poll() is None, f"rollmesh up exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"rollmesh up not ready:\n{log.read_text()}"
            time.sleep(0.2)
        yield json.loads(out.read_text())
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        assert code == 0, log.read_text()
        assert "[up] stopping" in log.read_text()


@pytest.fixture(scope="package")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    work = tmp_path_factory.mktemp("up")
    with rollmesh_up(work) as addresses:
        yield addresses, work


def managed_counter(root: Path, nemo_gym_python: Path, nemo_gym_servers: Path) -> Path:
    """NeMo Gym's example_session_state_mgmt server as environment `ng_counter` in the artifact root
    `root` (the verifier manages it with `nemo_gym_python`): the server's example rows."""
    folder = root / "environments" / "ng_counter"
    folder.mkdir(parents=True)
    (folder / "nemo_gym.toml").write_text(
        f'server = "example_session_state_mgmt"\npython = "{nemo_gym_python}"\n'
    )
    return nemo_gym_servers / "example_session_state_mgmt" / "data" / "example.jsonl"
