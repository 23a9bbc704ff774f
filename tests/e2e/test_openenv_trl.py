"""TRL's GRPOTrainer, unchanged, trains one step on a rollmesh environment served by `rollmesh serve
openenv`: tests/openenv_envs/trl_environment.py (TRL's `environment_factory` over OpenEnv's own
`GenericEnvClient`, run in the OpenEnv venv with TRL at rollmesh's pins) against the built-in
`arithmetic` environment served from a verifier in this process, on the shipped tiny model. Every
reward TRL got equals what rollmesh's verifier gives the same completion for the same row."""

from __future__ import annotations

import asyncio
import json
import os
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from rollmesh.launch.embedded import embedded_verifier
from rollmesh.openenv_server.server import openenv_server
from rollmesh.registry import BUILTIN_ROOT
from rollmesh_client import Client

SCRIPT = Path(__file__).resolve().parents[1] / "openenv_envs" / "trl_environment.py"
DATA = BUILTIN_ROOT / "environments" / "arithmetic" / "data" / "example.jsonl"
MODEL = BUILTIN_ROOT / "models" / "tiny-arith"


@pytest.mark.timeout(900)
async def test_trls_trainer_scores_its_rollouts_through_the_served_environment(
    openenv_trl_python: Path, tmp_path: Path
) -> None:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line]
    async with AsyncExitStack() as stack:
        address = await stack.enter_async_context(embedded_verifier())
        server = await stack.enter_async_context(
            openenv_server(
                environment="arithmetic", dataset=str(DATA), verifier=address, port=0, say=lambda _l: None
            )
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = await asyncio.create_subprocess_exec(
            str(openenv_trl_python),
            str(SCRIPT),
            server.url,
            str(MODEL),
            str(tmp_path / "trainer"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**env, "TRL_EXPERIMENTAL_SILENCE": "1"},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 800)
        assert proc.returncode == 0, err.decode()[-4000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["steps"] == 1
        scored = result["scored"]
        assert sorted(s["index"] for s in scored) == [0, 0, 1, 1]  # two generations of rows 0 and 1
        async with await Client.connect(verifier=address) as c:
            for s in scored:
                want = await c.verifier.verify("arithmetic", rows[s["index"]], s["text"])
                assert s["done"] is True and s["reward"] == pytest.approx(want.reward), s
