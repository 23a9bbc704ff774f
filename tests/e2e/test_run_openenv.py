"""docs/openenv.md's example as a reader runs it: OpenEnv's virtualenv (scripts/openenv_venv.py),
`openenv init`'s template, its openenv.toml, a row with an empty input and `rollmesh run` on the fake
model (the embedded mesh; the verifier runs the template's server as a sidecar). Each row's steps are
then replayed with OpenEnv's own client on a server of the same folder: the same rewards, `done` and
observations, and the row's reward is their sum."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.e2e.readme_blocks import DOCS
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block
from tests.openenv_servers import own_client
from tests.openenv_servers import serve
from tests.procs import REPO

PAGE = DOCS / "openenv.md"


def test_rollmesh_run_plays_the_openenv_template_as_openenvs_own_client_does(
    tmp_path: Path, openenv_python: Path
) -> None:
    (tmp_path / "scripts").symlink_to(REPO / "scripts")
    script = bash_block("`rollmesh run` plays it on the fake", PAGE)
    done = run_block(script, {}, tmp_path, {"ROLLMESH_GATEWAY_BACKEND": "fake"}, cwd=tmp_path, timeout_s=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(ln) for path in (tmp_path / "runs").glob("*/rollouts.jsonl") for ln in path.open()]
    assert len(rows) == 1, done.stdout[-2000:]
    row = rows[0]
    texts = [m["content"] for m in row["chat_messages"] if m["role"] == "assistant"]
    assert len(texts) == len(row["env_steps"]) == 3  # --max-steps 3: the template never says done
    assert row["chat_messages"][0]["role"] == "user"  # reset's observation is the prompt
    prompt = json.loads(row["chat_messages"][0]["content"])

    async def theirs() -> dict[str, object]:
        async with serve(openenv_python, tmp_path / "my_env", tmp_path / "own.log") as url:
            job = {"actions": [{"message": t} for t in texts]}
            answer: dict[str, object] = await own_client(openenv_python, "play", url, job)
            return answer

    own = asyncio.run(theirs())
    assert prompt == own["reset"]["observation"]  # type: ignore[index]
    for step, expected in zip(row["env_steps"], own["steps"], strict=True):  # type: ignore[call-overload]
        assert step["info"]["observation"] == expected["observation"]
        assert step["reward"] == expected["reward"] and step["done"] is expected["done"]
    assert row["reward"] == pytest.approx(sum(0.1 * len(t) for t in texts)) and row["reward"] > 0
