"""`rollmesh reverify -e code` of NeMo Gym's own shipped code_gen rollouts (0.4.0 and 0.7.0's
`example_rollouts.jsonl`, via the nemo_gym_servers_each fixture) against a real verifier: every row
is re-scored, none refused, and each reproduces the reward NeMo Gym recorded. Its rows hold no
tests: each is joined to its `example.jsonl` row (`--tasks`); without that join every row is
refused with a reason naming it, never scored by accident."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from rollmesh.cli import build_app
from rollmesh.mesh.server import MeshServer
from rollmesh_client import Client
from tests.integration import test_code_forgery
from tests.integration.test_nemo_gym_servers import read_jsonl

verifier = test_code_forgery.verifier  # the fixture: a verifier serving `code`, in each sandbox mode


async def _reverify(
    address: str, data: Path, out: Path, *extra: str, exit_code: int = 0
) -> tuple[list[dict[str, Any]], str]:
    """`rollmesh reverify` of the shipped rollouts; it exits 1 when a row was not re-scored."""
    args = ["reverify", str(data / "example_rollouts.jsonl"), "-e", "code", "--verifier", address]
    res = await asyncio.to_thread(CliRunner().invoke, build_app(), [*args, *extra, "-o", str(out)])
    assert res.exit_code == exit_code, res.output
    return read_jsonl(out), res.stderr


async def test_every_shipped_code_gen_row_reverifies_to_its_recorded_reward(
    verifier: tuple[Client, MeshServer, str], nemo_gym_servers_each: Path, tmp_path: Path
) -> None:
    _, server, _ = verifier
    data = nemo_gym_servers_each / "code_gen" / "data"
    recorded = [row["reward"] for row in read_jsonl(data / "example_rollouts.jsonl")]
    rows, stderr = await _reverify(
        server.address, data, tmp_path / "out.jsonl", "--tasks", str(data / "example.jsonl")
    )
    assert len(rows) == len(recorded) == 5 and "reverified 5 rows (0 errors" in stderr, stderr
    assert [r.get("reverify_error") for r in rows] == [None] * 5
    assert [r["previous_reward"] for r in rows] == recorded
    assert [r["reward"] for r in rows] == recorded and sorted(recorded) == [0.0, 0.0, 0.0, 0.0, 1.0]


async def test_shipped_rows_without_their_tests_are_refused_by_name(
    verifier: tuple[Client, MeshServer, str], nemo_gym_servers_each: Path, tmp_path: Path
) -> None:
    _, server, _ = verifier
    rows, stderr = await _reverify(
        server.address, nemo_gym_servers_each / "code_gen" / "data", tmp_path / "o.jsonl", exit_code=1
    )
    assert len(rows) == 5 and "5 errors" in stderr, stderr
    for row in rows:
        assert row["reverify_error"].startswith("BAD_TASK: "), row
        assert "--tasks" in row["reverify_error"], row
