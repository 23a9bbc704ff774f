"""Serve one verifiers 0.4 (`verifiers.v1`) taskset on loopback for rollmesh's bridge
(verifier/bridges/verifiers_env.py), with the same JSON protocol as _verifiers_server.py (whose HTTP app,
`rows` command line and RewardFunctionFailed this reuses: it sits in the same folder and imports
nothing of rollmesh either).

Run by the verifier with the interpreter of a virtualenv holding verifiers 0.4 and the taskset's
package. The job comes in ROLLMESH_VERIFIERS_ENV (JSON):

    {"taskset": "vf_v1_calc", "config": {...}, "paths": ["/abs/folder"],
     "judge": {"base_url": ..., "model": ..., "api_key_var": ...} | null}

`paths` go first on sys.path; the taskset is verifiers' own plugin resolution (`taskset_class(id)`:
an installed package or module exporting one `Taskset` subclass in `__all__`), built with its config
type validated from `config` (the `[config]` table of verifiers.toml). With `judge`, every judge
plugged in `config.task.judges` that names no `base_url` gets rollmesh's (the gateway's OpenAI
facade), its key variable and, unless it names one, rollmesh's model.

- A row is one `Task`: its prompt as the null harness sends it (`system_prompt` as a system message,
  then the prompt), its data (`TaskData`, JSON) in `verifier_metadata.verifiers.data`.
- Seeding a session builds the task from the row, and the task's and the taskset's `Toolset`s
  (verifiers' own `toolsets(config)` classmethods), each registered on an in-process MCP server
  (`Toolset.register`, the tools verifiers would serve); `setup()` and, for the task's, `setup_task`
  run as in verifiers' launcher. The tools are offered as verifiers' harness offers them
  (`<server>_<tool>`, the MCP input schema) and each call of a step runs through an MCP client of
  that server, its result content converted as verifiers' harness converts it.
- A turn without tool calls ends the episode (the null harness's chat loop).
- Score: a verifiers `Trace` of the prompt and the completion (assistant messages sampled), then
  `Task.score(trace)` with no runtime, as `vf replay` re-scores a trace: the reward is
  `trace.reward` (the weighted sum), the components are each reward's score and each metric.
  Scoring that raises (verifiers 0.4 does not count it 0: `Task.score` raises a `TaskError` for a
  reward, metric or judge that raised or timed out) or leaves a signal unscored is
  RewardFunctionFailed: 422, the verify fails by name, never a reward.
- Refused at load, by name (`refuse_unsupported`): a task that needs a container, `@vf.stop` hooks,
  and rewards, metrics or judges that need a runtime. Each per-task Toolset lives as long as its
  session (its `setup()` resources are not torn down: verifiers' launcher would stop its process).
  A task or Toolset with a `State` of its own is refused too (verifiers syncs that state between the
  toolsets and the trace; this bridge runs no task setup and syncs none), and so is a taskset that
  ships its own `Env` (multi-agent, cross-agent `finalize`; rollmesh runs the single-agent loop).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from _verifiers_server import RewardFunctionFailed  # type: ignore[import-not-found]
from _verifiers_server import serve_or_print_rows  # type: ignore[import-not-found]

Json = dict[str, Any]


def _prompt(data: Any) -> list[Json]:
    """The first request's messages as verifiers' null harness builds them (APPENDS_SYSTEM_PROMPT)."""
    from verifiers.v1.dialects.chat import message_to_wire  # type: ignore[import-not-found]

    out: list[Json] = []
    if data.system_prompt is not None:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    elif data.prompt is not None:
        out.extend(message_to_wire(m) for m in data.prompt)
    return out


class Session:
    """One rollout: its task, its toolsets' MCP servers and the tool names offered."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.servers: dict[str, Any] = {}  # server name -> MCPServer
        self.dispatch: dict[str, tuple[str, str]] = {}  # offered name -> (server, tool)
        self.tool_defs: list[Json] = []

    def get(self, key: str, default: Any = None) -> Any:
        """The 0.3 server's app reads `tool_defs` off a session's state."""
        return self.tool_defs if key == "tool_defs" else default


class Host:
    """The taskset and its live sessions, behind _verifiers_server's HTTP app."""

    def __init__(self, job: Json) -> None:
        for path in reversed(job.get("paths") or []):
            sys.path.insert(0, os.path.abspath(path))
        from verifiers.v1 import SingleAgentEnv  # type: ignore[import-not-found]
        from verifiers.v1.utils.loaders import environment_class  # type: ignore[import-not-found]
        from verifiers.v1.utils.loaders import taskset_class  # type: ignore[import-not-found]
        from verifiers.v1.utils.loaders import taskset_config_type  # type: ignore[import-not-found]

        raw = dict(job.get("config") or {})
        raw["id"] = job["taskset"]
        judge = job.get("judge")
        if judge:
            task = dict(raw.get("task") or {})
            task["judges"] = [_point(dict(j), judge) for j in task.get("judges") or []]
            raw["task"] = task
        self.config = taskset_config_type(job["taskset"]).model_validate(raw)
        self.taskset = taskset_class(job["taskset"])(self.config)
        self.env = self.taskset  # the app names its class as the environment's kind
        self.task_cls = type(self.taskset).task_type()
        self.data_cls = self.task_cls.data_type()
        self.sessions: dict[str, Session] = {}
        self.shared: list[Any] | None = None
        first = next(iter(self.taskset.take(1)), None)
        if first is not None:
            refuse_unsupported(first)
        for toolset in type(self.taskset).toolsets(self.config):
            refuse_stateful(toolset)
        env = environment_class(job["taskset"])
        if env is not SingleAgentEnv:
            raise ValueError(
                f"taskset {job['taskset']!r} ships its own Env ({env.__name__}): the rollmesh bridge "
                "runs the single-agent loop only"
            )

    def rows(self, n: int) -> list[Json]:
        if n < 0 and not self.taskset.bounded:
            raise ValueError(f"{type(self.taskset).__name__} is infinite: say how many rows (-n)")
        out: list[Json] = []
        for task in self.taskset:
            if 0 <= n <= len(out):
                break
            data = task.data.model_dump(mode="json", exclude_none=True)
            out.append(
                {
                    "responses_create_params": {"input": _prompt(task.data)},
                    "verifier_metadata": {"verifiers": {"data": data, "key": task.key}},
                    "task_id": str(task.data.id if task.data.id is not None else task.data.idx),
                    **({"expected_answer": data["answer"]} if isinstance(data.get("answer"), str) else {}),
                }
            )
        return out

    def task(self, row: Json) -> Any:
        meta = (row.get("verifier_metadata") or {}).get("verifiers") or {}
        if not isinstance(meta.get("data"), dict):
            raise ValueError("the row has no verifier_metadata.verifiers.data (a verifiers 0.4 task's data)")
        return self.task_cls(self.data_cls.model_validate(meta["data"]), self.config.task)

    async def _toolsets(self, task: Any) -> list[tuple[Any, bool]]:
        """(toolset, per-task) pairs: the task's, new for each session, then the taskset's, shared."""
        if self.shared is None:
            self.shared = list(type(self.taskset).toolsets(self.config))
            for toolset in self.shared:
                await toolset.setup()
        own = list(self.task_cls.toolsets(self.config.task))
        for toolset in own:
            await toolset.setup()
            await toolset.setup_task(task.data)
        return [(t, True) for t in own] + [(t, False) for t in self.shared]

    async def new_state(self, row: Json) -> Session:
        from mcp.client import Client  # type: ignore[import-not-found]
        from mcp.server.mcpserver import MCPServer  # type: ignore[import-not-found]

        session = Session(self.task(row))
        for toolset, _ in await self._toolsets(session.task):
            refuse_stateful(toolset)
            name = toolset.server_name
            if name in session.servers:
                raise ValueError(f"two toolsets are named {name!r}")
            server = MCPServer(name or type(toolset).__name__)
            toolset.register(server)
            session.servers[name] = server
            async with Client(server) as client:
                listed = await client.list_tools()
            for tool in listed.tools:
                full = f"{name}_{tool.name}" if name else tool.name
                if full in session.dispatch:
                    raise ValueError(f"duplicate tool name {full!r}")
                session.dispatch[full] = (name, tool.name)
                session.tool_defs.append(
                    {"name": full, "description": tool.description or "", "parameters": tool.input_schema}
                )
        return session

    async def step(self, state: Session, messages: list[Json]) -> tuple[list[Json], bool]:
        from mcp.client import Client
        from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content  # type: ignore[import-not-found]

        calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        if not calls:
            return [], True
        out: list[Json] = []
        for call in calls:
            name = call["function"]["name"]
            if name not in state.dispatch:
                content: Any = f"unknown tool {name!r}"
            else:
                server, raw = state.dispatch[name]
                try:
                    arguments = json.loads(call["function"].get("arguments") or "{}")
                except ValueError as exc:
                    arguments = None
                    content = f"invalid JSON arguments: {exc}"
                if isinstance(arguments, dict):
                    async with Client(state.servers[server]) as client:
                        result = await client.call_tool(raw, arguments)
                    content = mcp_content_to_chat_content(result.content)
                elif arguments is not None:
                    content = "the arguments are not a JSON object"
            out.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
        return out, False

    async def replay(self, row: Json, completion: list[Json]) -> Session:
        """Scoring reads only the messages: no tool runs again."""
        return Session(self.task(row))

    async def score(self, state: Session, completion: list[Json]) -> Json:
        from verifiers.v1 import AgentConfig  # type: ignore[import-not-found]
        from verifiers.v1 import MessageNode  # type: ignore[import-not-found]
        from verifiers.v1 import Trace  # type: ignore[import-not-found]
        from verifiers.v1.dialects.chat import parse_message  # type: ignore[import-not-found]
        from verifiers.v1.trace import AgentInfo  # type: ignore[import-not-found]
        from verifiers.v1.trace import TraceTask  # type: ignore[import-not-found]

        task = state.task
        messages = [*_prompt(task.data), *completion]
        nodes = [
            MessageNode(
                parent=i - 1 if i else None, message=parse_message(m), sampled=m.get("role") == "assistant"
            )
            for i, m in enumerate(messages)
        ]
        trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=AgentConfig()),
            nodes=nodes,
        )
        try:
            await task.score(trace)
        except Exception as exc:  # verifiers' TaskError (a reward, metric or judge raised; a timeout)
            raise RewardFunctionFailed(f"{type(exc).__name__}: {exc}") from exc
        unscored = sorted(k for k, v in {**trace.rewards, **trace.metrics}.items() if v is None)
        if unscored:
            raise RewardFunctionFailed(f"scoring left {unscored} unscored")
        metrics = {k: float(v.score) for k, v in trace.rewards.items()}
        metrics.update({k: float(v) for k, v in trace.metrics.items()})
        return {"reward": float(trace.reward), "metrics": metrics}


def refuse_stateful(toolset: Any) -> None:
    """A Toolset with a State of its own shares it with the rollout (verifiers syncs it over a channel
    into the trace's state, which scoring may read): refused by name, as `refuse_unsupported`."""
    from verifiers.v1.state import State  # type: ignore[import-not-found]

    if toolset._state_cls is not State:
        raise ValueError(
            f"toolset {type(toolset).__name__} keeps a State of its own ({toolset._state_cls.__name__}): "
            "the rollmesh bridge syncs no state with the rollout"
        )


def refuse_unsupported(task: Any) -> None:
    """What this bridge cannot do faithfully is refused by name (the server does not start, the
    environment is listed broken with this message), never left out of a score: a task that needs
    a container, `@vf.stop` hooks (rollmesh's loop runs none), and reward/metric functions or judges
    that need a runtime (verifiers skips those when it scores without one, as here)."""
    import inspect

    def needs_runtime(fn: Any) -> bool:
        param = inspect.signature(fn).parameters.get("runtime")
        return param is not None and param.default is inspect.Parameter.empty

    from verifiers.v1.state import State  # type: ignore[import-not-found]
    from verifiers.v1.state import state_cls  # type: ignore[import-not-found]

    name = type(task).__name__
    if state_cls(type(task)) is not State:
        raise ValueError(
            f"task {name} keeps a State of its own ({state_cls(type(task)).__name__}): the rollmesh bridge "
            "runs no task setup and syncs no state"
        )
    for toolset in type(task).toolsets(task.config):
        refuse_stateful(toolset)
    if getattr(task, "NEEDS_CONTAINER", False):
        raise ValueError(f"task {name} needs a container (NEEDS_CONTAINER): the rollmesh bridge runs none")
    if stops := [fn.__name__ for fn in task.hooks("stop")]:
        raise ValueError(f"task {name} has stop hooks {stops}: rollmesh's loop runs none")
    runtime = [fn.__name__ for kind in ("reward", "metric") for fn in task.hooks(kind) if needs_runtime(fn)]
    runtime += [j.reward_name for j in task.plugged_judges() if needs_runtime(j.score)]
    if runtime:
        raise ValueError(f"task {name}'s {runtime} need a runtime (a sandbox): the rollmesh bridge has none")


def _point(judge: Json, at: Json) -> Json:
    """A plugged judge pointed at rollmesh's OpenAI facade unless it names its own endpoint."""
    if judge.get("base_url"):
        return judge
    judge["base_url"] = at["base_url"]
    judge["api_key_var"] = at["api_key_var"]
    if not judge.get("model"):
        judge["model"] = at.get("model") or ""  # "": the gateway's default model
    return judge


def main() -> None:
    """Serve the taskset named in ROLLMESH_VERIFIERS_ENV; or, with `rows`, print its tasks as rollmesh
    rows (JSONL on stdout):

        python _verifiers_v1_server.py rows --taskset vf_v1_calc [--path DIR] [--config '{...}'] [-n N]
    """
    serve_or_print_rows("_verifiers_v1_server.py", "taskset", "config", "the taskset's config (JSON)", Host)


if __name__ == "__main__":
    main()
