"""Foreign environments behind the one Environment API: NeMo Gym resources servers, verifiers
environments, container tasks (Harbor format), OpenEnv environment servers.

Each kind of folder registers here (kinds.py: the file that marks its folders, and its class,
imported only when a folder of the kind is loaded); verifier/loader.py finds them through
`folder_kinds()`. A new kind adds one `register_folder_kind` line below: nothing else imports it.
"""

from __future__ import annotations

from rollmesh.verifier.bridges.kinds import FolderKind
from rollmesh.verifier.bridges.kinds import folder_kinds
from rollmesh.verifier.bridges.kinds import register_folder_kind
from rollmesh.verifier.environment import Environment

__all__ = ["FolderKind", "folder_kinds", "register_folder_kind"]


def _nemo_gym() -> type[Environment]:
    from rollmesh.verifier.bridges.nemo_gym import NemoGymEnvironment

    return NemoGymEnvironment


def _verifiers() -> type[Environment]:
    from rollmesh.verifier.bridges.verifiers_env import VerifiersEnvironment

    return VerifiersEnvironment


def _container_tasks() -> type[Environment]:
    from rollmesh.verifier.bridges.container.env import ContainerTasksEnvironment

    return ContainerTasksEnvironment


def _openenv() -> type[Environment]:
    from rollmesh.verifier.bridges.openenv_env import OpenEnvEnvironment

    return OpenEnvEnvironment


# In this order: a folder holding more than one of these files is of the first one's kind.
register_folder_kind(FolderKind("nemo_gym.toml", "a NeMo Gym resources server", _nemo_gym))
register_folder_kind(FolderKind("verifiers.toml", "a verifiers environment", _verifiers))
register_folder_kind(FolderKind("container_tasks.toml", "container tasks (Harbor format)", _container_tasks))
register_folder_kind(FolderKind("openenv.toml", "an OpenEnv environment server", _openenv))
