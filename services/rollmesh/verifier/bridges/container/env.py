"""The container-task environment: a folder `environments/<name>/` holding `container_tasks.toml`
(and no env.py) serves the Harbor tasks it names (task.py), one machine per rollout.

    tasks = "."                 # the folder of task folders, relative to this file
    provider = "daemonless"     # or "docker"; ROLLMESH_CONTAINER_PROVIDER overrides
    reward_key = "reward"       # which of reward.json's named rewards is the reward
    shell_timeout_s = 180       # the most one shell call may take (the agent may ask for less)
    output_limit = 16384        # bytes of a tool's output the model gets (head and tail)
    warm = 0                    # machines started ahead per task (ROLLMESH_CONTAINER_WARM overrides);
                                # the daemonless provider only (Docker fixes a container's labels)
    docker_storage = "enforce"  # or "unenforced": run tasks with a storage limit the daemon cannot
                                # enforce (else they fail STORAGE_LIMIT_UNSUPPORTED)
    [image_map]                 # image renames (also ROLLMESH_IMAGE_MAP="a=b,c=d", which wins)
    "ubuntu:24.04" = "rollmesh-base:bookworm"

A rollout: seed builds the task's image once (cached by content; the build timeout honoured) and
starts the rollout's machine, labelled with its job and rollout; the prompt is the task's
instruction (the row, task.py); the model works through three tools run in the machine: `shell`
(a command under `sh -c` in the image's working folder, with a per-call timeout and an output cap),
`read_file`, `write_file`. The agent's time (`[agent] timeout_sec`) starts at seed: a command
running when it ends is cut, and every later call answers that the time is up. Verify copies
tests/ to /tests (hidden until then), runs /tests/test.sh under `[verifier] timeout_sec` with
`[verifier] env`, and reads the verdict (rewards.py): every named reward is a reward component,
`reward_key`'s is the reward. Failures are named (errors.py), never a reward of 0. The machine is
removed when the session closes, and at the latest `agent + verifier timeout + LINGER_S` after seed
(a session the scheduler never closed).

The oracle (mesh/oracle.py): a row marked `"oracle": true` (what `rollmesh run --oracle` sends) may
call the hidden tool `ORACLE_TOOL`, which copies solution/ to /solution and runs /solution/solve.sh
under the agent's time, as Harbor's oracle agent does; a task without solve.sh is NO_SOLUTION.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import tomllib
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from rollmesh.mesh import config
from rollmesh.mesh.errors import ConfigError
from rollmesh.mesh.logging import get_logger
from rollmesh.mesh.oracle import ORACLE_ROW_KEY
from rollmesh.mesh.oracle import ORACLE_TOOL
from rollmesh.mesh.verify_result import VerifyResult
from rollmesh.verifier.bridges.container import rewards
from rollmesh.verifier.bridges.container.errors import BadHarborTask
from rollmesh.verifier.bridges.container.errors import MachineLost
from rollmesh.verifier.bridges.container.errors import NoSolution
from rollmesh.verifier.bridges.container.errors import TestTimeout
from rollmesh.verifier.bridges.container.images import parse_image_map
from rollmesh.verifier.bridges.container.images import recipe
from rollmesh.verifier.bridges.container.provider import ExecResult
from rollmesh.verifier.bridges.container.provider import Image
from rollmesh.verifier.bridges.container.provider import Labels
from rollmesh.verifier.bridges.container.provider import Machine
from rollmesh.verifier.bridges.container.provider import Provider
from rollmesh.verifier.bridges.container.provider import Relabelling
from rollmesh.verifier.bridges.container.task import ROW_KEY
from rollmesh.verifier.bridges.container.task import HarborTask
from rollmesh.verifier.bridges.container.task import load_tasks
from rollmesh.verifier.environment import EnvContext
from rollmesh.verifier.environment import Environment
from rollmesh.verifier.environment import Response
from rollmesh.verifier.environment import Session
from rollmesh.verifier.environment import Task
from rollmesh.verifier.environment import ToolCall
from rollmesh.verifier.environment import ToolOutput
from rollmesh.verifier.environment import seeding_session_id
from rollmesh.verifier.environment import tool
from rollmesh.verifier.errors import SessionRequired
from rollmesh.verifier.errors import ToolError

log = get_logger("rollmesh.verifier.container")

CONFIG_FILE = "container_tasks.toml"
WARM = "warm"  # the job and rollout labels of a machine started ahead, until a rollout takes it
PROVIDERS = ("daemonless", "docker")
DOCKER_STORAGE = ("enforce", "unenforced")
#: How long a machine outlives its task's agent + verifier time when its session is never closed.
LINGER_S = 300.0
_VERIFY_SLACK_S = 60.0


@dataclass(frozen=True)
class Settings:
    tasks: Path
    provider: str = "daemonless"
    reward_key: str = rewards.DEFAULT_KEY
    shell_timeout_s: float = 180.0
    output_limit: int = 16384
    image_map: dict[str, str] = field(default_factory=dict)
    #: Machines started ahead per task (never reused: each is a rollout's from the start).
    warm: int = 0
    #: "enforce" (a storage limit Docker cannot enforce is refused) or "unenforced".
    docker_storage: str = "enforce"


def read_settings(folder: Path) -> Settings:
    path = folder / CONFIG_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    image_map = {str(k): str(v) for k, v in dict(data.get("image_map", {})).items()}
    try:
        image_map.update(parse_image_map(str(config.read("ROLLMESH_IMAGE_MAP"))))
    except ValueError as exc:
        raise ConfigError(f"ROLLMESH_IMAGE_MAP: {exc}") from None
    provider = str(config.read("ROLLMESH_CONTAINER_PROVIDER")) or str(data.get("provider", "daemonless"))
    if provider not in PROVIDERS:
        raise ConfigError(f"{path}: provider must be one of {', '.join(PROVIDERS)}, got {provider!r}")
    docker_storage = str(data.get("docker_storage", "enforce"))
    if docker_storage not in DOCKER_STORAGE:
        raise ConfigError(
            f"{path}: docker_storage must be one of {', '.join(DOCKER_STORAGE)}, got {docker_storage!r}"
        )
    return Settings(
        tasks=(folder / str(data.get("tasks", "."))).resolve(),
        provider=provider,
        reward_key=str(data.get("reward_key", rewards.DEFAULT_KEY)),
        shell_timeout_s=float(data.get("shell_timeout_s", 180.0)),
        output_limit=int(data.get("output_limit", 16384)),
        image_map=image_map,
        warm=int(config.read("ROLLMESH_CONTAINER_WARM")) or int(data.get("warm", 0)),
        docker_storage=docker_storage,
    )


def make_provider(settings: Settings, where: Path) -> Provider:
    """The settings' provider; `warm` with a provider that cannot relabel a machine is a ConfigError."""
    provider: Provider
    if settings.provider == "docker":
        from rollmesh.verifier.bridges.container.docker import DockerProvider

        provider = DockerProvider()
        provider.storage_unenforced = settings.docker_storage == "unenforced"
    else:
        from rollmesh.verifier.bridges.container.daemonless import DaemonlessProvider

        provider = DaemonlessProvider()
    if settings.warm and not provider.relabels:
        raise ConfigError(
            f"{where / CONFIG_FILE}: warm = {settings.warm} (or ROLLMESH_CONTAINER_WARM): the "
            f"{provider.name} provider starts no machines ahead ({provider.relabels_not}); set warm = 0"
        )
    return provider


@dataclass
class Rollout:
    """A session's state: its task, its machine and the agent's deadline (monotonic)."""

    task: HarborTask
    machine: Machine
    deadline: float
    oracle: bool = False
    commands: int = 0
    timed_out: bool = False
    cleanup: asyncio.TimerHandle | None = None


class ContainerTasksEnvironment(Environment):
    """Harbor-format container tasks: one machine per rollout, graded by the task's own tests."""

    def __init__(self, context: EnvContext) -> None:
        super().__init__(context)
        if context.path is None:
            raise ConfigError("a container-task environment is a folder with container_tasks.toml")
        self.settings = read_settings(context.path)
        self.tasks = load_tasks(self.settings.tasks)
        self.provider = make_provider(self.settings, context.path)
        self._images: dict[str, asyncio.Task[Image]] = {}
        self._rollouts: dict[str, Rollout] = {}
        self._background: set[asyncio.Future[None]] = set()  # removals, warm machines starting
        self._warm: dict[str, list[Machine]] = {}  # task -> machines started ahead
        self._warming: dict[str, int] = {}  # task -> warm machines starting

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.provider.open()

    async def aclose(self) -> None:
        for rollout in list(self._rollouts.values()):
            if rollout.cleanup is not None:
                rollout.cleanup.cancel()
        self._rollouts.clear()
        await asyncio.gather(*list(self._background), return_exceptions=True)
        self._warm.clear()
        await self.provider.aclose()

    def problem(self) -> str:
        return self.provider.problem()

    def summary(self) -> str:
        """The task count, the provider and the live machines (`rollmesh envs list`, `rollmesh
        status`): "11 Harbor tasks on the daemonless provider; 2 machines live: job/0/0, job/1/0"."""
        live = self.provider.live()
        shown = ", ".join(m.labels.rollout for m in live[:5]) + (", ..." if len(live) > 5 else "")
        machines = f"{len(live)} machine{'s' if len(live) != 1 else ''} live" + (f": {shown}" if live else "")
        return f"{len(self.tasks)} Harbor tasks on the {self.provider.name} provider; {machines}"

    def sandbox_mode(self) -> str:
        return f"container:{self.provider.name}"

    # -- sessions --------------------------------------------------------------------------------------

    def task_of(self, task: Task) -> HarborTask:
        name = task.metadata.get(ROW_KEY)
        if not isinstance(name, str) or name not in self.tasks:
            known = ", ".join(sorted(self.tasks)[:10])
            raise BadHarborTask(
                f"environment {self.context.name!r}: the row's verifier_metadata.{ROW_KEY} is {name!r}, "
                f"not one of its tasks ({known})",
                metadata={"environment": self.context.name},
            )
        return self.tasks[name]

    async def image(self, harbor: HarborTask) -> Image:
        """The task's image: built once per task in this process (and once per content on disk)."""
        pending = self._images.get(harbor.name)
        if pending is None or (pending.done() and pending.exception() is not None):
            pending = asyncio.ensure_future(
                self.provider.prepare(
                    recipe(harbor, self.settings.image_map),
                    timeout_s=harbor.build_timeout_s,
                    where=f"task {harbor.name!r}",
                )
            )
            self._images[harbor.name] = pending
        return await asyncio.shield(pending)

    async def seed_session(self, task: Task) -> Rollout:
        harbor = self.task_of(task)
        image = await self.image(harbor)
        session_id = seeding_session_id()
        labels = Labels(
            job=session_id.partition("/")[0] or "-",
            rollout=session_id or "-",
            environment=self.context.name,
            task=harbor.name,
        )
        machine = await self._machine(harbor, image, labels)
        machine.image = dataclasses.replace(
            image,
            env={**image.env, **harbor.environment_env},
            workdir=harbor.workdir or image.workdir,
        )
        state = Rollout(
            task=harbor,
            machine=machine,
            deadline=time.monotonic() + harbor.agent_timeout_s,
            oracle=task.row.get(ORACLE_ROW_KEY) is True,
        )
        self._rollouts[machine.id] = state
        lifetime = harbor.agent_timeout_s + harbor.verifier_timeout_s + LINGER_S
        state.cleanup = asyncio.get_running_loop().call_later(lifetime, self._expire, machine.id)
        return state

    async def _machine(self, harbor: HarborTask, image: Image, labels: Labels) -> Machine:
        """The rollout's machine: a warm one of its task, relabelled for the rollout, else a new one;
        then the task's warm machines are made up again (`warm`). A machine is never reused."""
        pool = self._warm.setdefault(harbor.name, [])
        machine: Machine | None = None
        while pool and machine is None:
            candidate = pool.pop()
            if candidate.lost():
                await self.provider.remove(candidate)
            else:
                machine = candidate
        if machine is not None:
            assert isinstance(machine, Relabelling)  # warm machines only where the provider relabels
            await machine.relabel(labels)
        else:
            machine = await self.provider.start(image, harbor.limits, labels)
        self._refill(harbor, image)
        return machine

    def _refill(self, harbor: HarborTask, image: Image) -> None:
        """Start the machines the task's warm pool lacks, in the background (bounded by `warm`)."""
        if not self.settings.warm or not self.provider.relabels:
            return
        pool = self._warm.setdefault(harbor.name, [])
        missing = self.settings.warm - len(pool) - self._warming.get(harbor.name, 0)
        labels = Labels(job=WARM, rollout=WARM, environment=self.context.name, task=harbor.name)

        async def warm_one() -> None:
            try:
                pool.append(await self.provider.start(image, harbor.limits, labels))
            except Exception as exc:  # a warm machine is an optimisation: the next seed starts one
                log.warning("container_warm_machine_failed", task=harbor.name, error=str(exc))
            finally:
                self._warming[harbor.name] -= 1

        for _ in range(max(0, missing)):
            self._warming[harbor.name] = self._warming.get(harbor.name, 0) + 1
            starting = asyncio.ensure_future(warm_one())
            self._background.add(starting)
            starting.add_done_callback(self._background.discard)

    def _expire(self, key: str) -> None:
        state = self._rollouts.pop(key, None)
        if state is not None:
            log.warning("container_machine_expired", machine=key, rollout=state.machine.labels.rollout)
            self._background.add(task := asyncio.ensure_future(self._remove(state)))
            task.add_done_callback(self._background.discard)

    async def _remove(self, state: Rollout) -> None:
        if state.cleanup is not None:
            state.cleanup.cancel()
        self._rollouts.pop(state.machine.id, None)
        await self.provider.remove(state.machine)

    async def close_session(self, session: Session) -> None:
        if isinstance(session.state, Rollout):
            await self._remove(session.state)

    # -- tools -----------------------------------------------------------------------------------------

    def _rollout(self, session: Session) -> Rollout:
        state = session.state
        if not isinstance(state, Rollout):
            raise ToolError("this session has no machine")
        return state

    def _time_left(self, state: Rollout) -> float:
        left = state.deadline - time.monotonic()
        if left <= 0:
            state.timed_out = True
            raise ToolError(
                f"the agent's time ({state.task.agent_timeout_s:g}s, [agent] timeout_sec) is up: "
                "the machine runs no more commands; the task is graded as it is"
            )
        return left

    async def _run(
        self, state: Rollout, argv: list[str], *, stdin: bytes = b"", timeout_s: float
    ) -> tuple[ExecResult, float]:
        """Run a tool's command within the agent's time: the result and the time it was given."""
        limit = min(timeout_s, self._time_left(state))
        state.commands += 1
        result = await state.machine.exec(
            argv,
            stdin=stdin,
            timeout_s=limit,
            output_limit=self.settings.output_limit,
            user=state.task.agent_user,
        )
        if result.timed_out and limit < timeout_s:
            state.timed_out = True
        return result, limit

    async def call_tool(self, session: Session, call: ToolCall) -> ToolOutput:
        state = session.state
        if call.name == ORACLE_TOOL and isinstance(state, Rollout) and state.oracle:
            return ToolOutput(call.id, await self._solve(state))
        output = await super().call_tool(session, call)
        if isinstance(state, Rollout) and state.machine.lost():
            raise _lost(state, "a tool call")
        if isinstance(state, Rollout) and state.timed_out:  # the agent's time is up: the loop ends
            return dataclasses.replace(output, ends_agent=True)
        return output

    @tool
    async def shell(self, session: Session, command: str, timeout_s: float = 60.0) -> str:
        """Run a shell command (`sh -c`) in the task's machine, in its working folder. Returns the exit
        code and the output (long output keeps its head and tail). `timeout_s` cuts the command."""
        state = self._rollout(session)
        asked = min(max(float(timeout_s), 1.0), self.settings.shell_timeout_s)
        result, given = await self._run(state, ["/bin/sh", "-c", command], timeout_s=asked)
        return _describe(result, given)

    @tool
    async def read_file(self, session: Session, path: str) -> str:
        """Read a text file of the task's machine."""
        state = self._rollout(session)
        result, _ = await self._run(state, ["cat", "--", path], timeout_s=30.0)
        if result.exit_code != 0:
            raise ToolError(result.stderr.decode(errors="replace").strip() or f"cannot read {path}")
        return result.stdout.decode(errors="replace")

    @tool
    async def write_file(self, session: Session, path: str, content: str) -> str:
        """Write `content` to a file of the task's machine (its folders are made; an existing file is
        replaced)."""
        state = self._rollout(session)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        argv = ["/bin/sh", "-c", script, "write", path]
        result, _ = await self._run(state, argv, stdin=content.encode(), timeout_s=30.0)
        if result.exit_code != 0:
            raise ToolError(result.stderr.decode(errors="replace").strip() or f"cannot write {path}")
        return f"wrote {len(content.encode())} bytes to {path}"

    async def _solve(self, state: Rollout) -> str:
        task = state.task
        if not task.has_solution:
            raise NoSolution(f"task {task.name!r} has no solution/solve.sh: the oracle has nothing to run")
        await state.machine.put_tree(task.solution_dir, "/solution")
        left = self._time_left(state)
        result = await state.machine.exec(
            [
                "/bin/sh",
                "-c",
                "[ -x /solution/solve.sh ] || chmod +x /solution/solve.sh; exec /solution/solve.sh",
            ],
            timeout_s=left,
            output_limit=self.settings.output_limit,
            user=task.agent_user,
            env=dict(task.solution_env),
        )
        if result.timed_out:
            state.timed_out = True
        if state.machine.lost():
            raise _lost(state, "the oracle's solve.sh")
        return _describe(result, left)

    # -- verification ----------------------------------------------------------------------------------

    def verify_timeout_s(self, task: Task) -> float | None:
        try:
            return self.task_of(task).verifier_timeout_s + _VERIFY_SLACK_S
        except BadHarborTask:
            return None

    async def verify(self, task: Task, response: Response, session: Session | None = None) -> VerifyResult:
        if session is None or not isinstance(session.state, Rollout):
            raise SessionRequired(
                f"environment {self.context.name!r} grades the rollout's machine: verify needs its session"
            )
        state = session.state
        harbor = state.task
        machine = state.machine
        if machine.lost():
            raise _lost(state, "waiting for its verdict")
        # Stale verdicts go, and whatever the agent put in /tests (a conftest.py there would grade
        # with the task's own pytest); /logs/verifier is writable by the verifier's user, whoever it is.
        stale = "rm -rf /tests /logs/verifier/reward.*; mkdir -p -m 777 /logs/verifier;"
        await machine.put_tree(harbor.tests_dir, "/tests", before=stale)
        run = "[ -x /tests/test.sh ] || chmod +x /tests/test.sh; "
        run += "/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1; code=$?; "
        began = time.monotonic()
        result = await machine.exec(
            ["/bin/sh", "-c", run + _READ_VERDICT + "; exit $code"],
            timeout_s=harbor.verifier_timeout_s,
            output_limit=1 << 20,
            user=harbor.verifier_user or "",
            env=dict(harbor.verifier_env),
        )
        if machine.lost():
            raise _lost(state, "running tests/test.sh")
        if result.timed_out:
            raise TestTimeout(
                f"task {harbor.name!r}: tests/test.sh overran its {harbor.verifier_timeout_s:g}s "
                "([verifier] timeout_sec)",
                metadata={"task": harbor.name},
            )
        reward_json, reward_txt, log_tail = _split_verdict(result.stdout)
        verdict = rewards.parse(
            reward_json,
            reward_txt,
            key=self.settings.reward_key,
            exit_code=result.exit_code,
            output_tail=log_tail,
            task=harbor.name,
        )
        details: dict[str, Any] = {
            "task": harbor.name,
            "reward_file": verdict.source,
            "test_exit_code": result.exit_code,
            "test_seconds": round(time.monotonic() - began, 3),
            "agent_timed_out": state.timed_out,
            "commands": state.commands,
            "machine": machine.id,
            "provider": self.provider.name,
        }
        if state.oracle:
            details["oracle"] = True
        return VerifyResult(reward=verdict.reward, components=dict(verdict.named), details=details)


#: Each file after a marker line naming it: its content runs to the next marker (no size needed,
#: so no `wc` per file: a verdict costs the machine as few processes as it can).
_READ_VERDICT = (
    "for f in /logs/verifier/reward.json /logs/verifier/reward.txt; do "
    'if [ -f "$f" ]; then printf "\\n@@rollmesh-file %s\\n" "$f"; head -c 65536 "$f"; fi; done; '
    'printf "\\n@@rollmesh-file log\\n"; tail -c 2000 /logs/verifier/test-stdout.txt 2>/dev/null'
)


def _split_verdict(raw: bytes) -> tuple[bytes | None, bytes | None, str]:
    """The reward files and the test log's tail from `_READ_VERDICT`'s output."""
    found: dict[str, bytes] = {}
    marker = b"\n@@rollmesh-file "
    for part in raw.split(marker)[1:]:
        header, _, body = part.partition(b"\n")
        found[header.decode(errors="replace").strip()] = body
    log_tail = found.get("log", b"").decode(errors="replace")
    return found.get(rewards.REWARD_JSON), found.get(rewards.REWARD_TXT), log_tail


def _describe(result: ExecResult, timeout_s: float) -> str:
    parts = []
    if result.timed_out:
        parts.append(f"[the command was cut after {timeout_s:.3g}s]")
    else:
        parts.append(f"exit code: {result.exit_code}")
    out = result.stdout.decode(errors="replace")
    err = result.stderr.decode(errors="replace")
    if out:
        parts.append(out.rstrip("\n"))
    if err:
        parts.append("[stderr]\n" + err.rstrip("\n"))
    return "\n".join(parts)


def _lost(state: Rollout, doing: str) -> MachineLost:
    why = state.machine.lost() or "it stopped answering"
    return MachineLost(
        f"task {state.task.name!r}: machine {state.machine.id} was lost during {doing}: {why}",
        metadata={"task": state.task.name, "machine": state.machine.id},
    )
