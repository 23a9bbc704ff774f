"""A benchmark's stdout is its one JSON object: what Ray, vLLM and child processes print (raylet
messages came before the result in bench/short_answers.py's stdout) goes to stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from bench._meta import result_stream
out = result_stream()
print("(raylet) noise from this process")
subprocess.run(["echo", "noise from a child"], check=True)
print(json.dumps({"name": "x", "ratio": 1.0}), file=out)
print("noise at exit")
"""


def test_only_the_result_reaches_stdout() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REPO)], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == {"name": "x", "ratio": 1.0}, done.stdout
    for noise in ("(raylet) noise from this process", "noise from a child", "noise at exit"):
        assert noise in done.stderr
