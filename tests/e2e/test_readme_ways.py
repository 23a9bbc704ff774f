"""The README's "Ways to run it" that need nothing but this checkout run as written (the embedded
gateway on the fake model through ROLLMESH_GATEWAY_BACKEND): 2, your own rows (the block writes
them), and 7, rollouts streamed into a trainer's RolloutSink (the block starts the example trainer)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.readme_blocks import README
from tests.e2e.readme_blocks import bash_block
from tests.e2e.readme_blocks import run_block

WAYS = bash_block("## Ways to run it")


def way(n: int) -> str:
    """The lines of way `n`: from its `# n.` comment to the next way's."""
    return re.split(r"^# \d+\. ", WAYS, flags=re.M)[n].split("\n", 1)[1]


@pytest.mark.parametrize("n", [2, 7])
def test_the_readme_way_runs_as_written(n: int, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(README.parent / "examples")
    script = way(n) + "\nwait\n"  # the trainer of way 7 ends with the job: wait for it here
    done = run_block(script, {}, tmp_path, {"ROLLMESH_GATEWAY_BACKEND": "fake"}, cwd=tmp_path, timeout_s=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "SUCCEEDED" in done.stdout + done.stderr or "mean reward" in done.stdout, done.stdout[-2000:]
    if n == 7:
        assert "(the gRPC sink)" in done.stderr, done.stderr[-2000:]
