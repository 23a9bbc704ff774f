"""The kinds of environment folder besides an `env.py`: a folder that holds a kind's config file
(`nemo_gym.toml`, `verifiers.toml`, `container_tasks.toml`, `openenv.toml`) and no env.py is an
environment of that kind. A kind registers here once (`register_folder_kind`: its config file's name
and a function that gives its Environment class); the loader (verifier/loader.py) asks
`folder_kinds()` and imports no kind itself. The built-in kinds register in bridges/__init__.py, each
class imported only when a folder of its kind is loaded (a bridge brings in aiohttp and sidecar
supervision: a verifier that serves none of them does not pay for their imports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rollmesh.verifier.environment import Environment


@dataclass(frozen=True)
class FolderKind:
    config_file: str  # the file that marks a folder of this kind (no env.py beside it)
    what: str  # what such a folder holds, for messages: "a NeMo Gym resources server"
    environment: Callable[[], type[Environment]]  # its Environment class (imported on the first call)


_KINDS: dict[str, FolderKind] = {}


def register_folder_kind(kind: FolderKind) -> None:
    """Make `kind` known to the loader; a config file name two kinds claim is a ValueError."""
    held = _KINDS.get(kind.config_file)
    if held is not None and held != kind:
        raise ValueError(f"{kind.config_file} already marks {held.what}; {kind.what} needs a file of its own")
    _KINDS[kind.config_file] = kind


def folder_kinds() -> list[FolderKind]:
    """The registered kinds in registration order: a folder holding several of their config files
    is of the first one's kind."""
    return list(_KINDS.values())
