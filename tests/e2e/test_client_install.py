"""The SDK alone, as a trainer installs it into an environment of its own (docs/sdk.md): `pip install
./clients/python` into a fresh virtualenv holds `rollmesh_client` and its dependencies, not the
services, and that client talks to a running registry."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import venv
from pathlib import Path

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.procs import ROLLMESH
from tests.procs import spawn_server

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, importlib.util, sys
from rollmesh_client import Client
from rollmesh_client.v1 import registry_pb2 as pb

async def main() -> None:
    async with await Client.connect(registry=sys.argv[1]) as c:
        art = await c.registry.resolve(pb.ARTIFACT_KIND_DATASET, "arithmetic")
        print(art.name, art.sha256[:8])

assert importlib.util.find_spec("rollmesh") is None, "the services came along"
asyncio.run(main())
"""


def test_the_sdk_installs_alone_and_reaches_a_service(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    alone = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    install = shlex.split(bash_block("## Installing the SDK alone", DOCS / "sdk.md"), comments=True)
    assert install[:2] == ["pip", "install"], install  # docs/sdk.md's command, in the new venv, pinned
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-c", str(REPO / "requirements.lock"), *install[2:]],
        capture_output=True, text=True, timeout=600, check=False, env=alone, cwd=REPO,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-3000:]
    (tmp_path / "probe.py").write_text(SCRIPT)
    with spawn_server([str(ROLLMESH), "serve", "registry", "--port", "0"]) as server:
        run = subprocess.run(
            [str(python), str(tmp_path / "probe.py"), server.address],
            capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=alone,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("arithmetic "), run.stdout
    assert sys.prefix != str(env_dir)
