"""Finding environment plugins: `environments/<name>/env.py` in every artifact root (or, in a folder
with no env.py, the config file of a registered folder kind: `nemo_gym.toml` for a NeMo Gym
resources server, `verifiers.toml`, `container_tasks.toml`; verifier/bridges/kinds.py), then the
`rollmesh.environments` entry-point group.

Collision rule (the registry's): a name found in two roots, or in a root and an entry point, is
not loaded; it is listed as broken with the registry's ARTIFACT_COLLISION message, and every use
of the name raises that `ArtifactCollision` (FAILED_PRECONDITION). With
ROLLMESH_ALLOW_ROOT_OVERRIDE=1 the earliest root wins and entry points lose to roots.

A plugin that fails to import or to construct is listed as broken with its error; the others load.
`env.py` is imported by file path under a unique module name, so a folder called `math` or `code`
never shadows the standard library.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from rollmesh.mesh.errors import RollmeshError
from rollmesh.mesh.logging import get_logger
from rollmesh.registry.catalog import Catalog
from rollmesh.registry.catalog import Kind
from rollmesh.registry.errors import ArtifactCollision
from rollmesh.verifier import bridges
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import Environment

log = get_logger("rollmesh.verifier.loader")

ENTRY_POINT_GROUP = "rollmesh.environments"
ContextFactory = Callable[[str, Path | None], EnvContext]


@dataclass
class Loaded:
    name: str
    env: Environment
    source: str
    example_dataset: str = ""


@dataclass
class Broken:
    name: str
    source: str
    error: str
    exc: RollmeshError | None = None


@dataclass
class Discovery:
    loaded: dict[str, Loaded]
    broken: dict[str, Broken]


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text[:500]


def module_name_for(path: Path) -> str:
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in path.parent.name)
    return f"rollmesh_env_{stem}_{digest}"


def import_file(path: Path) -> ModuleType:
    """Import `path` as a fresh module with a unique name (never shadows a stdlib module)."""
    name = module_name_for(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def environment_class(module: ModuleType) -> type[Environment]:
    """The module's `ENVIRONMENT`, else the one Environment subclass defined in it."""
    chosen = getattr(module, "ENVIRONMENT", None)
    if isinstance(chosen, type) and issubclass(chosen, Environment):
        return chosen
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Environment)
        and obj.__module__ == module.__name__
        and not inspect.isabstract(obj)
    ]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise TypeError(
            f"expected exactly one Environment subclass (or ENVIRONMENT = Cls), found {len(found)}: {names}"
        )
    return found[0]


def _build(cls: type[Environment], name: str, path: Path | None, ctx: ContextFactory) -> Environment:
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise TypeError(f"{cls.__name__} does not implement: {missing}")
    return cls(ctx(name, path))


def discover(catalog: Catalog, make_context: ContextFactory, *, entry_points: bool = True) -> Discovery:
    """Load every environment (blocking imports: call before serving, or in a thread)."""
    loaded: dict[str, Loaded] = {}
    broken: dict[str, Broken] = {}
    folder_names = [item.name for item in catalog.list_artifacts(Kind.ENVIRONMENT) if item.is_dir]
    for name in folder_names:
        try:
            item = catalog.locate(Kind.ENVIRONMENT, name)
        except ArtifactCollision as exc:
            broken[name] = Broken(name, "", exc.message, exc)
            log.warning("environment_collision", name=name, error=exc.message)
            continue
        env_file = item.path / "env.py"
        kind = None if env_file.is_file() else _kind_of(item.path)
        source = str(item.path / kind.config_file if kind is not None else env_file)
        try:
            if kind is not None:
                cls = kind.environment()
            elif not env_file.is_file():
                files = ", ".join(k.config_file for k in bridges.folder_kinds())
                raise FileNotFoundError(f"{item.path} has no env.py (nor any of {files})")
            else:
                cls = environment_class(import_file(env_file))
            env = _build(cls, name, item.path, make_context)
        except Exception as exc:
            broken[name] = Broken(name, source, _one_line(exc))
            log.warning("environment_broken", name=name, source=source, error=_one_line(exc))
            continue
        example = item.path / "data" / "example.jsonl"
        loaded[name] = Loaded(name, env, source, str(example) if example.is_file() else "")
    if entry_points:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _load_entry_point(ep, catalog, make_context, loaded, broken)
    for ok in loaded.values():
        log.info("environment_loaded", name=ok.name, source=ok.source)
    return Discovery(loaded, broken)


def environment_names(catalog: Catalog, *, entry_points: bool = True) -> list[str]:
    """The names `discover` would try to load, without loading any (cheap: a listing of the roots'
    environments/ folders and the installed entry points), sorted."""
    names = {item.name for item in catalog.list_artifacts(Kind.ENVIRONMENT) if item.is_dir}
    if entry_points:
        names |= {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def _kind_of(folder: Path) -> bridges.FolderKind | None:
    """The registered kind whose config file `folder` holds (the first registered when several)."""
    return next((k for k in bridges.folder_kinds() if (folder / k.config_file).is_file()), None)


def _load_entry_point(
    ep: importlib.metadata.EntryPoint,
    catalog: Catalog,
    make_context: ContextFactory,
    loaded: dict[str, Loaded],
    broken: dict[str, Broken],
) -> None:
    name, source = ep.name, f"entry-point:{ep.value}"
    if name in loaded or name in broken:
        if catalog.allow_override:
            return
        first = loaded[name].source if name in loaded else broken[name].source
        exc = ArtifactCollision(
            f"environment {name!r} is defined in 2 places: {first}, {source}; remove or rename one, "
            "or set ROLLMESH_ALLOW_ROOT_OVERRIDE=1 to let the artifact roots win",
            metadata={"kind": Kind.ENVIRONMENT.value, "name": name, "path_0": first, "path_1": source},
        )
        loaded.pop(name, None)
        broken[name] = Broken(name, source, exc.message, exc)
        return
    try:
        obj = ep.load()
        if not (isinstance(obj, type) and issubclass(obj, Environment)):
            raise TypeError(f"{ep.value} is not an Environment subclass")
        env = _build(obj, name, None, make_context)
    except Exception as exc:
        broken[name] = Broken(name, source, _one_line(exc))
        log.warning("environment_broken", name=name, source=source, error=_one_line(exc))
        return
    loaded[name] = Loaded(name, env, source)
