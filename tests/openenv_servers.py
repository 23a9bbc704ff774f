"""OpenEnv servers and OpenEnv's own client for the tests and the bench of the OpenEnv host bridge
(verifier/bridges/openenv_env.py), all in the OpenEnv virtualenv (`openenv_python`): `openenv init`'s
template written into a folder, a server started on a free 127.0.0.1 port and waited on by its
/health, and tests/openenv_envs/own_client.py playing or timing an episode with `GenericEnvClient`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from rollmesh.verifier.bridges.openenv_env import LAUNCHER

ENVS = Path(__file__).resolve().parent / "openenv_envs"
GUESS_ENV = ENVS / "guess_env"
COUNTER_MCP_ENV = ENVS / "counter_mcp_env"
OWN_CLIENT = ENVS / "own_client.py"


def init_template(python: Path, folder: Path, name: str = "echo_env") -> Path:
    """`openenv init NAME` in `folder`: the environment's folder. Offline: it writes the template, and
    the `uv lock` it then tries (where uv is installed) is kept from the network (UV_OFFLINE)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(python.parent / "openenv"), "init", name],
        cwd=folder,
        env={**os.environ, "UV_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and (folder / name / "openenv.yaml").is_file(), done.stdout + done.stderr
    return folder / name


@contextlib.asynccontextmanager
async def serve(python: Path, env_dir: Path, log: Path, timeout_s: float = 120) -> AsyncIterator[str]:
    """The app of `env_dir` (its openenv.yaml's) served by the bridge's launcher in the OpenEnv
    interpreter on a free loopback port until the block ends; yields its URL once /health answers."""
    port_file = log.with_suffix(".addr")
    env = {**os.environ, "ROLLMESH_OPENENV_APP": json.dumps({"env_dir": str(env_dir), "app": ""})}
    env |= {"ROLLMESH_PORT_FILE": str(port_file), "ROLLMESH_SIDECAR_PORT": "0"}
    for var in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(var, None)
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            str(python), str(LAUNCHER), env=env, stdout=out, stderr=out, start_new_session=True
        )
    try:
        url = await _healthy(proc, port_file, log, timeout_s)
        yield url
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


def _text(path: Path) -> str:
    """The file's text ("" while there is none)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


async def _healthy(proc: asyncio.subprocess.Process, port_file: Path, log: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                tail = (await asyncio.to_thread(_text, log))[-2000:]
                raise RuntimeError(f"the OpenEnv server exited {proc.returncode}: {tail}")
            if address := (await asyncio.to_thread(_text, port_file)).strip():
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://{address}/health") as resp:
                        if resp.status == 200:
                            return f"http://{address}"
            await asyncio.sleep(0.05)
    tail = (await asyncio.to_thread(_text, log))[-2000:]
    raise TimeoutError(f"the OpenEnv server did not answer /health in {timeout_s}s: {tail}")


async def own_client(python: Path, mode: str, url: str, job: dict[str, Any], *args: str) -> Any:
    """tests/openenv_envs/own_client.py `mode` on `url` with `job` (its docstring): its JSON answer."""
    proc = await asyncio.create_subprocess_exec(
        str(python),
        str(OWN_CLIENT),
        mode,
        url,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(job).encode()), 300)
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out)
