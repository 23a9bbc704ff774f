"""`rollmesh envs list` as a table: each environment's sandbox (what isolates the code it runs) and
whole cells, so a bridged environment's server and interpreter, or a broken one's error, are read to
the end (they were cut at 80 and 120 characters)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.procs import ROLLMESH
from tests.procs import run_cli
from tests.procs import spawn_server

LONG = "x" * 150


async def test_the_table_shows_each_sandbox_and_whole_cells(tmp_path: Path) -> None:
    broken = tmp_path / "environments" / "broken_plugin" / "env.py"
    broken.parent.mkdir(parents=True)
    broken.write_text(f"raise RuntimeError('{LONG}')\n")
    with spawn_server([str(ROLLMESH), "serve", "verifier", "--port", "0"], cwd=tmp_path) as verifier:
        env = {"COLUMNS": "400", "ROLLMESH_VERIFIER_ADDR": verifier.address}
        code, table, err = await run_cli("envs", "list", env=env)
        assert code == 0, err
        code, listed, err = await run_cli("envs", "list", "--json", env=env)
        assert code == 0, err
    sandboxes = {e["name"]: e["sandbox"] for e in json.loads(listed)["environments"]}
    assert sandboxes["code"], sandboxes  # the code sandbox's mode
    rows = {cells[0]: cells for line in table.splitlines() if len(cells := _cells(line)) == 5}
    assert rows["name"][2] == "sandbox", rows
    assert rows["code"][2] == sandboxes["code"] and rows["arithmetic"][2] == "-", rows
    assert rows["broken_plugin"][1] == "BROKEN" and LONG in rows["broken_plugin"][4], rows


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("│┃").replace("┃", "│").split("│")]
