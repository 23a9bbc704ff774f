"""A worker process of `WorkerPool`: reads one JSON request per line, answers one JSON line.

Run as `python -m rollmesh.verifier._worker`. A target is `module:function`
or `/path/to/file.py:function`; the function gets the request's args and returns JSON-able data.
Anything imported libraries print goes to stderr, so stdout carries only answers.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

_modules: dict[str, ModuleType] = {}


def _resolve(target: str) -> Callable[..., Any]:
    where, _, fn = target.rpartition(":")
    if where not in _modules:
        if where.endswith(".py"):
            from rollmesh.verifier.loader import import_file

            module = import_file(Path(where))
        else:
            module = importlib.import_module(where)
        _modules[where] = module
    func: Callable[..., Any] = getattr(_modules[where], fn)
    return func


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        try:
            req = json.loads(line)
            result = _resolve(req["target"])(*req.get("args", []), **req.get("kwargs", {}))
            answer = json.dumps({"ok": result})
        except Exception as exc:
            answer = json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        out.write(answer + "\n")


if __name__ == "__main__":
    main()
