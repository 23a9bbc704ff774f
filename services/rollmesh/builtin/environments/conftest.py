"""pytest: import every environment's `tests/test_env.py` under a unique module name.

Each environment folder has the same `tests/test_env.py` path, and folders such as `math` and
`code` must not become packages (they would shadow the standard library), so these modules are
imported by file path, like the service imports `env.py`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


class _EnvTestModule(pytest.Module):
    def _getobj(self) -> ModuleType:
        path = Path(self.path)
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:10]
        name = f"rollmesh_envtest_{path.parent.parent.name}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    if module_path.name == "test_env.py" and module_path.parent.name == "tests":
        return _EnvTestModule.from_parent(parent, path=module_path)
    return None
