"""What a task's machine is made from, provider-neutral: the image map, the Dockerfile (parsed into
the instructions a provider acts on), the compose file's primary service, and the image's content
digest (what a build is cached by).

The image map (`ubuntu:24.04=registry.local/ubuntu:24.04`, comma-separated, or a TOML table) renames
an image wherever a task names one: a Dockerfile's FROM, `[environment] docker_image`, a compose
service's `image`. For clusters that reach only a private registry, and for the tests here, which
reach no registry and map the tasks' bases to `rollmesh-base:<suite>`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh.verifier.bridges.container.errors import BadHarborTask
from rollmesh.verifier.bridges.container.errors import ImageBuildFailed
from rollmesh.verifier.bridges.container.task import MAIN_SERVICE
from rollmesh.verifier.bridges.container.task import HarborTask

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
class Healthcheck:
    """A compose service's healthcheck: the test (Docker's form: `CMD ...` or `CMD-SHELL ...`) and
    its timing in seconds (compose's defaults where the file gives none: `_healthcheck`)."""

    test: tuple[str, ...]
    interval_s: float
    timeout_s: float
    retries: int
    start_period_s: float


@dataclass(frozen=True)
class Service:
    """A compose service besides `main`: its image's recipe, and how it runs (None: the image's own
    command or entrypoint). It runs beside the rollout's machine, which reaches it by its name."""

    name: str
    recipe: Recipe
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    healthcheck: Healthcheck | None = None


@dataclass(frozen=True)
class Recipe:
    """How to make a task's image: a base (mapped), the steps after FROM, and the build context."""

    base: str
    steps: tuple[Instruction, ...] = ()
    context: Path | None = None
    #: From a compose file's main service: variables and limits it sets.
    environment: Mapping[str, str] = field(default_factory=dict)
    #: A compose file's other services (not part of this image's digest: each has its own).
    services: tuple[Service, ...] = ()

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


#: What a service besides `main` may say; any other key is refused by name (volumes, networks,
#: ports to the host, ... are not made). `depends_on` and `restart` are read as start order only.
SERVICE_KEYS = frozenset(
    {
        "image",
        "build",
        "environment",
        "command",
        "entrypoint",
        "healthcheck",
        "depends_on",
        "expose",
        "restart",
    }
)


def compose_recipe(task: HarborTask, path: Path, image_map: ImageMap) -> Recipe:
    """The main service's recipe, with the compose file's other services (`Recipe.services`)."""
    import yaml

    where = f"task {task.name!r}"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BadHarborTask(f"{where}: {path.name} is not readable YAML ({exc})") from None
    services = doc.get("services") if isinstance(doc, dict) else None
    if not isinstance(services, dict) or MAIN_SERVICE not in services:
        raise BadHarborTask(f"{where}: {path.name} has no `services: {MAIN_SERVICE}:` (the primary service)")
    main = _service_recipe(task, path, MAIN_SERVICE, services[MAIN_SERVICE], image_map)
    others = []
    for name, spec in sorted((str(k), v) for k, v in services.items() if k != MAIN_SERVICE):
        if not isinstance(spec, dict):
            raise BadHarborTask(f"{where}: {path.name}: services.{name} must be a mapping")
        unknown = sorted(str(k) for k in spec if k not in SERVICE_KEYS)
        if unknown:
            raise BadHarborTask(
                f"{where}: {path.name}: services.{name} uses {', '.join(unknown)}, which rollmesh does not "
                f"run (a service besides `{MAIN_SERVICE}` may have {', '.join(sorted(SERVICE_KEYS))})"
            )
        others.append(
            Service(
                name=name,
                recipe=_service_recipe(task, path, name, spec, image_map),
                command=_words(spec.get("command"), f"{where}: services.{name}.command"),
                entrypoint=_words(spec.get("entrypoint"), f"{where}: services.{name}.entrypoint"),
                healthcheck=_healthcheck(spec.get("healthcheck"), f"{where}: services.{name}.healthcheck"),
            )
        )
    return dataclasses.replace(main, services=tuple(others))


def _service_recipe(task: HarborTask, path: Path, name: str, spec: Any, image_map: ImageMap) -> Recipe:
    where = f"task {task.name!r}"
    if not isinstance(spec, dict):
        raise BadHarborTask(f"{where}: {path.name}: services.{name} must be a mapping")
    env = compose_environment(spec.get("environment"), f"{where}: services.{name}.environment")
    build = spec.get("build")
    if build is not None:
        context_rel, dockerfile = (build, "Dockerfile") if isinstance(build, str) else (".", "Dockerfile")
        if isinstance(build, dict):
            context_rel = str(build.get("context", "."))
            dockerfile = str(build.get("dockerfile", "Dockerfile"))
        context = (path.parent / context_rel).resolve()
        if not context.is_relative_to(task.path):
            raise BadHarborTask(
                f"{where}: the build context {context_rel!r} of services.{name} is outside the task"
            )
        found = dockerfile_recipe(context / dockerfile, context, image_map, where=where)
        return Recipe(base=found.base, steps=found.steps, context=context, environment=env)
    image = spec.get("image")
    if not isinstance(image, str) or not image:
        raise BadHarborTask(f"{where}: services.{name} has neither `build` nor `image`")
    return Recipe(base=mapped(image, image_map), environment=env)


def _words(raw: Any, where: str) -> tuple[str, ...] | None:
    """A compose command or entrypoint: a list as it is, a string split as a shell would."""
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            return tuple(literal(w, where) for w in shlex.split(raw))
        except ValueError as exc:
            raise BadHarborTask(f"{where}: {exc}") from None
    if isinstance(raw, list):
        return tuple(literal(str(w), where) for w in raw)
    raise BadHarborTask(f"{where} must be a string or a list")


_VARIABLE = re.compile(r"\$(?:\{|[A-Za-z_])")


def literal(text: str, where: str) -> str:
    """A compose value with `$$` as `$`; a variable (`$VAR`, `${VAR}`) is refused by name: rollmesh
    does not interpolate compose files from its own environment."""
    found = _VARIABLE.search(text.replace("$$", ""))
    if found:
        raise BadHarborTask(
            f"{where}: {text!r} uses compose variable interpolation ({found.group()}...), which rollmesh "
            "does not do; write the value, or $$ for a literal $"
        )
    return text.replace("$$", "$")


def _healthcheck(raw: Any, where: str) -> Healthcheck | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise BadHarborTask(f"{where} must be a mapping")
    if raw.get("disable") is True:
        return None
    test = raw.get("test")
    if isinstance(test, str):
        words: tuple[str, ...] = ("CMD-SHELL", literal(test, f"{where}.test"))
    elif isinstance(test, list) and test and str(test[0]) in ("CMD", "CMD-SHELL", "NONE"):
        words = tuple(literal(str(w), f"{where}.test") for w in test)
    else:
        raise BadHarborTask(f"{where}.test must be a string or a list starting with CMD or CMD-SHELL")
    if words[0] == "NONE":
        return None
    return Healthcheck(
        test=words,
        interval_s=_seconds(raw.get("interval", "30s"), f"{where}.interval"),
        timeout_s=_seconds(raw.get("timeout", "30s"), f"{where}.timeout"),
        retries=int(raw.get("retries", 3)),
        start_period_s=_seconds(raw.get("start_period", "0s"), f"{where}.start_period"),
    )


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(raw: Any, where: str) -> float:
    """A compose duration (`1m30s`, `500ms`, `10s`) in seconds."""
    text = str(raw).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise BadHarborTask(f"{where}: {text!r} is not a duration like 10s, 1m30s or 500ms")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def compose_environment(raw: Any, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {str(k): "" if v is None else literal(str(v), where) for k, v in raw.items()}
    if isinstance(raw, list):
        out: dict[str, str] = {}
        for item in raw:
            key, _, value = str(item).partition("=")
            out[key] = literal(value, where)
        return out
    raise BadHarborTask(f"{where} must be a mapping or a list")


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
