"""Harbor's task format, read at the edge: a folder of task folders is a dataset (one row per task)
and, with `container_tasks.toml` beside it, an environment (env.py).

A task folder (Harbor 0.25):

    instruction.md          the prompt
    task.toml               [agent] timeout_sec; [verifier] timeout_sec, env, user; [solution] env;
                            [environment] build_timeout_sec, docker_image, cpus, memory_mb / memory ("2G"),
                            storage_mb / storage, allow_internet / network_mode, workdir, env;
                            [task] name, ... (the current schema) or a flat [metadata] table (the older)
    environment/            Dockerfile, or docker-compose.yaml whose primary service is `main`
    tests/test.sh           hidden from the agent; copied to /tests after it, run by the verifier
    solution/solve.sh       optional: what the oracle runs

Only what rollmesh acts on is read; a value of the wrong type, a missing instruction.md or test.sh,
an environment with neither a Dockerfile, a compose file nor `docker_image` is a `BadHarborTask`
naming the task and the field in one line. What rollmesh cannot do is refused by name, never
ignored: `network_mode = "allowlist"`, GPUs or TPUs, multi-step tasks (`steps`), a separate
verifier environment, Windows.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh.verifier.bridges.container.errors import BadHarborTask

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
MAIN_SERVICE = "main"
ROW_KEY = "harbor_task"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: Harbor features rollmesh does not run, refused by name when a task uses them: (table, key); the
#: table "" is the top level.
_UNSUPPORTED = (
    ("", "artifacts"),
    ("verifier", "collect"),
    ("environment", "mcp_servers"),
    ("environment", "healthcheck"),
    ("environment", "skills_dir"),
)


@dataclass(frozen=True)
class Limits:
    """What a task's machine may use; None: no limit of that kind asked for."""

    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    allow_internet: bool = False


@dataclass(frozen=True)
class HarborTask:
    name: str
    path: Path
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    build_timeout_s: float
    limits: Limits
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    #: `[solution] env`: what the oracle's solve.sh runs with.
    solution_env: Mapping[str, str] = field(default_factory=dict)
    verifier_user: str = ""
    agent_user: str = ""
    environment_env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""
    docker_image: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    @property
    def has_solution(self) -> bool:
        return (self.solution_dir / "solve.sh").is_file()

    @property
    def dockerfile(self) -> Path | None:
        found = self.environment_dir / "Dockerfile"
        return found if found.is_file() else None

    @property
    def compose_file(self) -> Path | None:
        return next(
            (self.environment_dir / n for n in COMPOSE_FILES if (self.environment_dir / n).is_file()), None
        )

    def row(self) -> dict[str, Any]:
        """The task as a dataset row: the instruction is the prompt; the environment finds the task
        again by its folder's name (`verifier_metadata.harbor_task`), never by a path from the row."""
        return {
            "task_id": self.name,
            "responses_create_params": {"input": [{"role": "user", "content": self.instruction}]},
            "verifier_metadata": {ROW_KEY: self.name},
        }


def is_task_folder(path: Path) -> bool:
    return (path / "task.toml").is_file()


def task_folders(root: Path) -> list[Path]:
    """The task folders under `root` (itself when it is one), by name."""
    if is_task_folder(root):
        return [root]
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and is_task_folder(p)), key=lambda p: p.name)


def load_tasks(root: Path) -> dict[str, HarborTask]:
    """Every task under `root` by name; the first bad one raises (its name and field in one line)."""
    folders = task_folders(root)
    if not folders:
        raise BadHarborTask(f"{root}: no Harbor task here (no task.toml in it or in a folder under it)")
    return {t.name: t for t in map(load_task, folders)}


def rows(root: Path) -> Iterator[dict[str, Any]]:
    """A folder of Harbor tasks as dataset rows, in name order."""
    for task in load_tasks(root).values():
        yield task.row()


def load_task(path: Path) -> HarborTask:
    name = path.name
    if not _NAME.match(name):
        raise BadHarborTask(f"task folder {name!r}: a task's folder name is letters, digits, '.', '_', '-'")

    def bad(problem: str) -> BadHarborTask:
        return BadHarborTask(f"task {name!r}: {problem}", metadata={"task": name})

    try:
        config = tomllib.loads((path / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise bad(f"task.toml is not readable TOML ({exc})") from None
    instruction_file = path / "instruction.md"
    if not instruction_file.is_file():
        raise bad("no instruction.md")
    instruction = instruction_file.read_text(encoding="utf-8", errors="replace")
    if not (path / "tests" / "test.sh").is_file():
        raise bad("no tests/test.sh")
    if config.get("steps"):
        raise bad("multi-step tasks (`steps`) are not supported")
    agent = _table(config, "agent", bad)
    verifier = _table(config, "verifier", bad)
    env = _table(config, "environment", bad)
    if verifier.get("environment") is not None or verifier.get("environment_mode") == "separate":
        raise bad("a separate verifier environment ([verifier.environment]) is not supported")
    if str(env.get("os", "linux")).lower() != "linux":
        raise bad(f"[environment] os = {env.get('os')!r}: only linux tasks run")
    for accel in ("gpus", "tpu", "gpu_types"):
        if env.get(accel):
            raise bad(f"[environment] {accel}: accelerators are not supported")
    for where, key in _UNSUPPORTED:
        if (_table(config, where, bad) if where else config).get(key):
            place = f"[{where}] {key}" if where else key
            raise bad(f"{place} is not supported (artifacts, collect hooks, MCP servers, health checks)")
    docker_image = _string(env, "docker_image", "environment", bad)
    task = HarborTask(
        name=name,
        path=path.resolve(),
        instruction=instruction,
        agent_timeout_s=_seconds(agent, "timeout_sec", DEFAULT_AGENT_TIMEOUT_S, "agent", bad),
        verifier_timeout_s=_seconds(verifier, "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S, "verifier", bad),
        build_timeout_s=_seconds(env, "build_timeout_sec", DEFAULT_BUILD_TIMEOUT_S, "environment", bad),
        limits=Limits(
            cpus=_number(env, "cpus", "environment", bad),
            memory_mb=_size_mb(env, "memory", bad),
            storage_mb=_size_mb(env, "storage", bad),
            allow_internet=_internet(env, bad),
        ),
        verifier_env=_env_table(verifier, "verifier", bad),
        solution_env=_env_table(_table(config, "solution", bad), "solution", bad),
        verifier_user=_user(verifier, "verifier", bad),
        agent_user=_user(agent, "agent", bad),
        environment_env=_env_table(env, "environment", bad),
        workdir=_string(env, "workdir", "environment", bad),
        docker_image=docker_image,
        metadata=_metadata(config),
    )
    if task.dockerfile is None and task.compose_file is None and not docker_image:
        raise bad(
            "environment/ has no Dockerfile nor docker-compose.yaml, and [environment] names no docker_image"
        )
    return task


def _table(config: Mapping[str, Any], key: str, bad: Any) -> Mapping[str, Any]:
    value = config.get(key, {})
    if not isinstance(value, Mapping):
        raise bad(f"[{key}] must be a table")
    return value


def _number(table: Mapping[str, Any], key: str, where: str, bad: Any) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise bad(f"[{where}] {key} must be a positive number, got {value!r}")
    return float(value)


def _seconds(table: Mapping[str, Any], key: str, default: float, where: str, bad: Any) -> float:
    value = _number(table, key, where, bad)
    return default if value is None else value


def _string(table: Mapping[str, Any], key: str, where: str, bad: Any) -> str:
    value = table.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad(f"[{where}] {key} must be a string, got {value!r}")
    return value


def _user(table: Mapping[str, Any], where: str, bad: Any) -> str:
    value = table.get("user")
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise bad(f"[{where}] user must be a name or a uid, got {value!r}")
    return str(value)


def _env_table(table: Mapping[str, Any], where: str, bad: Any) -> dict[str, str]:
    value = table.get("env", {})
    if not isinstance(value, Mapping) or not all(isinstance(v, (str, int, float)) for v in value.values()):
        raise bad(f"[{where}] env must be a table of strings")
    return {str(k): _host_value(str(v)) for k, v in value.items()}


_TEMPLATE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _host_value(text: str) -> str:
    """Harbor's `${VAR}` / `${VAR:-default}`, resolved from the verifier's environment."""
    return _TEMPLATE.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), text)


def _size_mb(env: Mapping[str, Any], key: str, bad: Any) -> int | None:
    """`<key>_mb` (a number) or the older `<key>` ("2G", "512M", "64K")."""
    value = env.get(f"{key}_mb")
    if value is not None:
        number = _number(env, f"{key}_mb", "environment", bad)
        return None if number is None else int(number)
    text = env.get(key)
    if text is None:
        return None
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([GgMmKk])\s*", str(text))
    if not isinstance(text, str) or match is None:
        raise bad(f"[environment] {key} must look like '2G', '512M' or '64K', got {text!r}")
    amount, unit = float(match.group(1)), match.group(2).upper()
    return max(1, int(amount * {"G": 1024, "M": 1, "K": 1 / 1024}[unit]))


def _internet(env: Mapping[str, Any], bad: Any) -> bool:
    """No network unless the task asks for it: `allow_internet = true` (older) or `network_mode =
    "public"`. (Harbor's own default is public; rollmesh's is none: docs/container-tasks.md.)"""
    mode = env.get("network_mode")
    if mode is not None:
        if mode == "allowlist":
            raise bad("[environment] network_mode = 'allowlist' is not supported (use no-network or public)")
        if mode not in ("public", "no-network"):
            raise bad(f"[environment] network_mode must be 'public' or 'no-network', got {mode!r}")
        return bool(mode == "public")
    allow = env.get("allow_internet")
    if allow is None:
        return False
    if not isinstance(allow, bool):
        raise bad(f"[environment] allow_internet must be true or false, got {allow!r}")
    return allow


def _metadata(config: Mapping[str, Any]) -> dict[str, Any]:
    """The current schema's [task] table and the older flat [metadata], merged (the first wins)."""
    out: dict[str, Any] = {}
    for key in ("task", "metadata"):
        value = config.get(key)
        if isinstance(value, Mapping):
            for k, v in value.items():
                out.setdefault(str(k), v)
    return out
