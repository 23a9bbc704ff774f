"""What a task's machine is made from, provider-neutral: the image map, the Dockerfile (parsed into
the instructions a provider acts on), the compose file's primary service, and the image's content
digest (what a build is cached by).

The image map (`ubuntu:24.04=registry.local/ubuntu:24.04`, comma-separated, or a TOML table) renames
an image wherever a task names one: a Dockerfile's FROM, `[environment] docker_image`, a compose
service's `image`. For clusters that reach only a private registry, and for the tests here, which
reach no registry and map the tasks' bases to `rollmesh-base:<suite>`.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollmesh.verifier.bridges.container.errors import BadHarborTask, ImageBuildFailed
from rollmesh.verifier.bridges.container.task import MAIN_SERVICE, HarborTask

ImageMap = Mapping[str, str]


def parse_image_map(text: str) -> dict[str, str]:
    """`FROM=TO[,FROM=TO...]` as a dict; a pair without `=` is an error naming it."""
    out: dict[str, str] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        source, sep, target = pair.partition("=")
        if not sep or not source.strip() or not target.strip():
            raise ValueError(f"image map entry {pair!r} is not FROM=TO")
        out[source.strip()] = target.strip()
    return out


def mapped(image: str, image_map: ImageMap) -> str:
    """`image` renamed by the map (an exact name first, then the name without its tag)."""
    if image in image_map:
        return image_map[image]
    name, _, tag = image.partition(":")
    if name in image_map and tag:
        target = image_map[name]
        return target if ":" in target.rsplit("/", 1)[-1] else f"{target}:{tag}"
    return image


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its keyword (upper case), its flags (`--chown=1:1`), its arguments
    (the JSON form's list, or the shell form's text as one item), and its line."""

    keyword: str
    args: tuple[str, ...]
    flags: Mapping[str, str] = field(default_factory=dict)
    json_form: bool = False
    line: int = 0


@dataclass(frozen=True)
class Recipe:
    """How to make a task's image: a base (mapped), the steps after FROM, and the build context."""

    base: str
    steps: tuple[Instruction, ...] = ()
    context: Path | None = None
    #: From a compose file's main service: variables and limits it sets.
    environment: Mapping[str, str] = field(default_factory=dict)

    def digest(self, base_id: str) -> str:
        """The image's identity: the base's, the steps, every file of the context (name, mode,
        content). Two tasks with the same environment share one image."""
        h = hashlib.sha256()
        h.update(json.dumps([base_id, [(i.keyword, i.args, dict(i.flags)) for i in self.steps]]).encode())
        h.update(json.dumps(sorted(self.environment.items())).encode())
        if self.context is not None and any(i.keyword in ("COPY", "ADD") for i in self.steps):
            for path in sorted(self.context.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    h.update(f"{path.relative_to(self.context)}\0{path.stat().st_mode & 0o777}\0".encode())
                    h.update(hashlib.sha256(path.read_bytes()).digest())
        return h.hexdigest()[:32]


def recipe(task: HarborTask, image_map: ImageMap) -> Recipe:
    """The task's image recipe: the compose file's main service (its build, or its image) when there
    is a compose file (as Harbor's Docker environment), else the Dockerfile, else `[environment]
    docker_image` (no build)."""
    if task.compose_file is not None:
        return compose_recipe(task, task.compose_file, image_map)
    if task.dockerfile is not None:
        return dockerfile_recipe(
            task.dockerfile, task.environment_dir, image_map, where=f"task {task.name!r}"
        )
    return Recipe(base=mapped(task.docker_image, image_map))


def dockerfile_recipe(path: Path, context: Path, image_map: ImageMap, *, where: str) -> Recipe:
    instructions = parse_dockerfile(path.read_text(encoding="utf-8", errors="replace"), where=where)
    froms = [i for i in instructions if i.keyword == "FROM"]
    if not froms or instructions[0].keyword not in ("FROM", "ARG"):
        raise ImageBuildFailed(f"{where}: the Dockerfile does not start with FROM")
    if len(froms) > 1:
        raise ImageBuildFailed(
            f"{where}: multi-stage Dockerfiles (FROM on line {froms[1].line}) are not supported"
        )
    first = froms[0]
    if first.flags:
        raise ImageBuildFailed(f"{where}: FROM {' '.join(f'--{k}' for k in first.flags)} is not supported")
    base_words = first.args[0].split()
    if len(base_words) not in (1, 3):
        raise ImageBuildFailed(f"{where}: FROM {first.args[0]!r} is not `FROM image [AS name]`")
    steps = tuple(i for i in instructions if i is not first)
    return Recipe(base=mapped(base_words[0], image_map), steps=steps, context=context)


def compose_recipe(task: HarborTask, path: Path, image_map: ImageMap) -> Recipe:
    import yaml

    where = f"task {task.name!r}"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BadHarborTask(f"{where}: {path.name} is not readable YAML ({exc})") from None
    services = doc.get("services") if isinstance(doc, dict) else None
    if not isinstance(services, dict) or MAIN_SERVICE not in services:
        raise BadHarborTask(f"{where}: {path.name} has no `services: {MAIN_SERVICE}:` (the primary service)")
    others = sorted(str(s) for s in services if s != MAIN_SERVICE)
    if others:
        raise BadHarborTask(
            f"{where}: {path.name} has services besides `{MAIN_SERVICE}` ({', '.join(others)}): "
            "a machine is the main service alone"
        )
    main = services[MAIN_SERVICE]
    if not isinstance(main, dict):
        raise BadHarborTask(f"{where}: {path.name}: services.{MAIN_SERVICE} must be a mapping")
    env = compose_environment(main.get("environment"), where)
    build = main.get("build")
    if build is not None:
        context_rel, dockerfile = (build, "Dockerfile") if isinstance(build, str) else (".", "Dockerfile")
        if isinstance(build, dict):
            context_rel = str(build.get("context", "."))
            dockerfile = str(build.get("dockerfile", "Dockerfile"))
        context = (path.parent / context_rel).resolve()
        if not context.is_relative_to(task.path):
            raise BadHarborTask(f"{where}: the build context {context_rel!r} is outside the task")
        found = dockerfile_recipe(context / dockerfile, context, image_map, where=where)
        return Recipe(base=found.base, steps=found.steps, context=context, environment=env)
    image = main.get("image")
    if not isinstance(image, str) or not image:
        raise BadHarborTask(f"{where}: services.{MAIN_SERVICE} has neither `build` nor `image`")
    return Recipe(base=mapped(image, image_map), environment=env)


def compose_environment(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {str(k): "" if v is None else str(v) for k, v in raw.items()}
    if isinstance(raw, list):
        out: dict[str, str] = {}
        for item in raw:
            key, _, value = str(item).partition("=")
            out[key] = value
        return out
    raise BadHarborTask(f"{where}: services.{MAIN_SERVICE}.environment must be a mapping or a list")


def parse_dockerfile(text: str, *, where: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (the default escape `\\`)."""
    out: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        pending += stripped
        out.append(_instruction(pending, start, where))
        pending = ""
    if pending.strip():
        out.append(_instruction(pending, start, where))
    return out


def _instruction(text: str, line: int, where: str) -> Instruction:
    keyword, _, rest = text.strip().partition(" ")
    keyword = keyword.upper()
    rest = rest.strip()
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.strip()
    if rest.startswith("["):
        try:
            parsed = json.loads(rest)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list) and all(isinstance(a, str) for a in parsed):
            return Instruction(keyword, tuple(parsed), flags, json_form=True, line=line)
    if keyword in ("COPY", "ADD"):
        try:
            words = shlex.split(rest)
        except ValueError as exc:
            raise ImageBuildFailed(f"{where}: Dockerfile line {line}: {exc}") from None
        return Instruction(keyword, tuple(words), flags, line=line)
    return Instruction(keyword, (rest,), flags, line=line)


def key_values(text: str) -> list[tuple[str, str]]:
    """ENV/ARG/LABEL arguments: `k=v k2="v 2"`, or the old `ENV key value with spaces`."""
    words = shlex.split(text, posix=True)
    if words and "=" not in words[0]:
        key, _, value = text.strip().partition(" ")
        return [(key, value.strip())]
    return [(k, v) for k, _, v in (w.partition("=") for w in words)]
