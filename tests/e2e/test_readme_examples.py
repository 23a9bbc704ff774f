"""The README's SDK examples run as written against a mesh started with `rollmesh up`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLES = re.findall(r"<!-- sdk-example -->\n```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_sdk_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_sdk_example_runs(index: int, mesh: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    addrs, _ = mesh
    script = tmp_path / f"example_{index}.py"
    script.write_text(EXAMPLES[index])
    env = {**os.environ, **{f"ROLLMESH_{k.upper()}_ADDR": v for k, v in addrs.items()}}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "the example printed nothing"
    if index == 0:
        assert "environments:" in done.stdout and "pass@4" in done.stdout
    else:
        assert "arithmetic" in done.stdout and "1.0 5" in done.stdout
