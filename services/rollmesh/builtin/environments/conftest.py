"""pytest: import every environment's `tests/test_env.py` under a unique module name.

Each environment folder has the same `tests/test_env.py` path, and folders such as `math` and
`code` must not become packages (they would shadow the standard library), so these modules are
imported by file path, as the service imports `env.py` (`loader.import_file`).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rollmesh.verifier.loader import import_file


class _EnvTestModule(pytest.Module):
    def _getobj(self) -> ModuleType:
        return import_file(Path(self.path))


def pytest_pycollect_makemodule(module_path: Path, parent: Any) -> Any:
    if module_path.name == "test_env.py" and module_path.parent.name == "tests":
        return _EnvTestModule.from_parent(parent, path=module_path)
    return None
