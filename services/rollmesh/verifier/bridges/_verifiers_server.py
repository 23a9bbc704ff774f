"""Serve one verifiers (0.3.x API) environment on loopback for rollmesh's bridge
(verifier/bridges/verifiers_env.py).

Run by the verifier with the interpreter of a virtualenv holding `verifiers` and the environment's
package, never with rollmesh's own: it imports nothing of rollmesh, only the standard library,
aiohttp (a dependency of verifiers) and verifiers. The job comes in ROLLMESH_VERIFIERS_ENV (JSON):

    {"env_id": "vf_calc", "args": {...}, "paths": ["/abs/folder"]}

`paths` are put first on sys.path (an environment module that is not installed), then
`verifiers.load_environment(env_id, **args)` builds the environment, as `vf-eval` does.

It binds 127.0.0.1:$ROLLMESH_SIDECAR_PORT (0: any free port), writes `127.0.0.1:<port>` to
$ROLLMESH_PORT_FILE and answers JSON:
- GET /            {"ok": true, "kind": <class name>, "group": <the rubric has group reward functions>}
- GET /rows?n=N    the environment's eval dataset (else its dataset) as rollmesh rows
- POST /seed       {"session", "row"}: verifiers' init_state + setup_state for the row; answers the
                   session's tool definitions (OpenAI function form) and whether it is done already
- POST /step       {"session", "messages"}: one assistant turn (with tool results the loop ran, none
                   for a verifiers environment's own tools): appended to the trajectory; the stop
                   conditions decide `done`, else `env_response` gives the messages (tool results of
                   ToolEnv / StatefulToolEnv, a MultiTurnEnv's reply) as verifiers' own loop would
- POST /score      {"session"?, "row", "completion"}: `rubric.score_rollout` on the session's state
                   (or, without a session, on a state replayed from the row and the completion's
                   assistant turns) with `completion` as the completion: {"reward", "metrics"}
- POST /score_group {"row", "members": [{"session"?, "completion"}]}: `rubric.score_group` on the
                   members' states (each as /score builds it) together: {"results": [{"reward",
                   "metrics"}, ...]}, one per member in order
- POST /close      {"session"}
Errors: 400 {"error"} for a body that does not fit, 409 for /score on a group rubric (score_group),
404 for an unknown session, 422 {"error"} when the environment's scoring raised (a reward function,
a judge, math-verify failing or timing out: verifiers would have counted it 0), 500 {"error"} for
anything else the environment raised.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import logging
import os
import socket
import sys
import traceback
from typing import Any

from aiohttp import web  # in every verifiers virtualenv (verifiers depends on it)

Json = dict[str, Any]
_ROW_KEYS = ("answer", "info", "task", "example_id")


def _dump(value: Any) -> Any:
    """A verifiers message (pydantic) or a plain value as JSON-able data."""
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _openai_message(message: Any) -> Json:
    """A verifiers message as an OpenAI chat message (tool calls in the `function` form)."""
    raw: Json = dict(_dump(message))
    calls = raw.pop("tool_calls", None) or []
    if calls:
        raw["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ]
    return raw


def _openai_tool(tool: Any) -> Json:
    t = _dump(tool)
    return {
        "type": "function",
        "function": {
            "name": t["name"],
            "description": t.get("description", ""),
            "parameters": t.get("parameters", {}),
        },
    }


class Host:
    """The environment and its live sessions (their verifiers State objects)."""

    def __init__(self, env: Any) -> None:
        import verifiers as vf  # type: ignore[import-not-found]

        self.vf = vf
        self.env = env
        self.sessions: dict[str, Json] = {}
        watch_scoring_errors(getattr(env, "rubric", None))

    def _normalize(self, messages: Any) -> Any:
        from verifiers.utils.message_utils import normalize_messages  # type: ignore[import-not-found]

        return normalize_messages(messages, field_name="messages")

    def rows(self, n: int) -> list[Json]:
        dataset = None
        for getter in ("get_eval_dataset", "get_dataset"):
            try:
                dataset = getattr(self.env, getter)(n=n)
            except Exception:
                dataset = None
            if dataset is not None:
                break
        if dataset is None:
            raise ValueError("the environment has neither an eval dataset nor a dataset")
        out = []
        for i, item in enumerate(dataset):
            prompt = item.get("prompt")
            prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else _dump(prompt)
            meta = {k: item[k] for k in _ROW_KEYS if k in item and item[k] is not None}
            row: Json = {
                "responses_create_params": {"input": prompt},
                "verifier_metadata": {"verifiers": meta},
            }
            if "answer" in meta:
                row["expected_answer"] = meta["answer"]
            row["task_id"] = str(meta.get("example_id", i))
            out.append(row)
        return out

    def rollout_input(self, row: Json) -> Json:
        params = row.get("responses_create_params") or {}
        prompt = params.get("input")
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt or [])
        meta = (row.get("verifier_metadata") or {}).get("verifiers") or {}
        item: Json = {"prompt": prompt, "example_id": meta.get("example_id", 0)}
        for key in ("answer", "info", "task"):
            if key in meta:
                item[key] = meta[key]
        if "answer" not in item and row.get("expected_answer") is not None:
            item["answer"] = row["expected_answer"]
        return item

    async def new_state(self, row: Json) -> Json:
        from verifiers.types import ClientConfig  # type: ignore[import-not-found]

        client = ClientConfig(api_base_url="http://127.0.0.1:9/v1", api_key_var="ROLLMESH_UNUSED_KEY")
        state = await self.env.init_state(self.rollout_input(row), client, "rollmesh")
        setup = await self.env.setup_state(state)
        state = setup if setup is not None else state
        state["rollmesh_messages"] = list(state["prompt"])
        return dict(state) if not isinstance(state, dict) else state

    async def step(self, state: Json, messages: list[Json]) -> tuple[list[Any], bool]:
        """One assistant turn (and any tool results) into the state; (env messages, done)."""
        from verifiers.utils.message_utils import concat_messages  # type: ignore[import-not-found]

        turn = self._normalize(messages)
        prompt = list(state["rollmesh_messages"])
        step = {
            "prompt": prompt,
            "completion": turn,
            "response": None,
            "tokens": None,
            "reward": None,
            "advantage": None,
            "is_truncated": False,
            "trajectory_id": state["trajectory_id"],
            "extras": {},
        }
        await self.env.add_trajectory_step(state, step)
        conversation = concat_messages([prompt, turn])
        state["rollmesh_messages"] = conversation
        if await self.env.is_completed(state):
            return [], True
        reply = list(self._normalize(await self.env.env_response(conversation, state)))
        state["rollmesh_messages"] = concat_messages([conversation, reply])
        final = state.get("final_env_response")
        if final is not None:
            return list(self._normalize(final)), True
        return reply, await self.env.is_completed(state)

    async def replay(self, row: Json, completion: list[Json]) -> Json:
        """A state rebuilt from the row and the completion's assistant turns (env responses replayed)."""
        state = await self.new_state(row)
        turn: list[Json] = []
        for message in completion:
            if message.get("role") == "assistant" and turn:
                _, done = await self.step(state, turn)
                turn = []
                if done:
                    break
            if message.get("role") == "assistant":
                turn = [message]
        if turn:
            await self.step(state, turn)
        return state

    async def score(self, state: Json, completion: list[Json]) -> Json:
        if self.env.rubric.has_group_rewards:
            raise GroupRubric("this environment's rubric has group reward functions (score_group)")
        state["completion"] = self._normalize(completion)
        await _judged(self.env.rubric.score_rollout(state))
        return _verdict(state)

    async def score_group(self, states: list[Json], completions: list[list[Json]]) -> list[Json]:
        for state, completion in zip(states, completions, strict=True):
            state["completion"] = self._normalize(completion)
        await _judged(self.env.rubric.score_group(states))
        return [_verdict(state) for state in states]


async def _judged(scoring: Any) -> None:
    """Await the rubric's scoring; a reward function that raised (verifiers logs it and counts 0)
    raises RewardFunctionFailed instead."""
    failed: list[str] = []
    token = _REWARD_ERRORS.set(failed)
    try:
        await scoring
    finally:
        _REWARD_ERRORS.reset(token)
    if failed:
        raise RewardFunctionFailed(f"{failed[0]} (verifiers would have scored it 0)")


def _verdict(state: Json) -> Json:
    metrics = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}
    return {"reward": float(state["reward"]), "metrics": metrics}


class GroupRubric(Exception):
    pass


class RewardFunctionFailed(Exception):
    """The environment's scoring raised (a reward function, a judge's call among them; math-verify
    failing or timing out): verifiers logs it and counts 0; the bridge fails the verify instead (422),
    so an answer nobody judged is never a reward of 0."""


_REWARD_ERRORS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "rollmesh_reward_errors", default=None
)

# What verifiers 0.3 logs where it counts a scoring function 0 without a verdict: Rubric's
# `_call_individual_reward_func` / `_call_group_reward_func` (error), MathRubric's `correct_answer`
# (math-verify's worker raised or overran HARD_TIMEOUT_SECONDS: warning; it took longer than
# `timeout_seconds`: debug).
_REWARD_ERROR_PREFIXES = (
    "Error calling reward function",
    "Error calling group reward function",
    "Math verification failed",
    "Math verification hit hard timeout",
    "Math verification exceeded time limit",
)


class _RewardErrors(logging.Handler):
    """Collects the rubric's "Error calling reward function" records into the scoring call's list."""

    def emit(self, record: logging.LogRecord) -> None:
        errors = _REWARD_ERRORS.get()
        message = record.getMessage()
        if errors is not None and message.startswith(_REWARD_ERROR_PREFIXES):
            errors.append(" ".join(message.split())[:300])


def watch_scoring_errors(rubric: Any) -> None:
    """Hear every record above: the handler on verifiers' logger, whose level (VF_LOG_LEVEL) may not
    drop them; and each MathRubric's own logger at DEBUG (its time-limit zero is a debug record).
    The console handlers verifiers installs keep their own levels: nothing more is printed."""
    root = logging.getLogger("verifiers")
    if not any(isinstance(h, _RewardErrors) for h in root.handlers):
        root.addHandler(_RewardErrors(logging.DEBUG))
    if root.getEffectiveLevel() > logging.WARNING:
        root.setLevel(logging.WARNING)
    for sub in getattr(rubric, "rubrics", None) or []:
        watch_scoring_errors(sub)
    if type(rubric).__name__ == "MathRubric" and isinstance(getattr(rubric, "logger", None), logging.Logger):
        rubric.logger.setLevel(logging.DEBUG)


def _app(host: Host) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        group = bool(getattr(getattr(host.env, "rubric", None), "has_group_rewards", False))
        return web.json_response({"ok": True, "kind": type(host.env).__name__, "group": group})

    async def rows(request: web.Request) -> web.Response:
        n = int(request.query.get("n", "-1"))
        return web.json_response(await asyncio.to_thread(host.rows, n))

    async def seed(body: Json) -> Json:
        state = await host.new_state(body["row"])
        host.sessions[str(body["session"])] = state
        tools = [_openai_tool(t) for t in state.get("tool_defs") or []]
        return {"tools": tools}

    async def step(body: Json) -> Json:
        state = host.sessions.get(str(body["session"]))
        if state is None:
            raise KeyError(str(body["session"]))
        messages, done = await host.step(state, list(body["messages"]))
        return {"messages": [_openai_message(m) for m in messages], "done": done}

    async def state_of(row: Json, member: Json) -> Json:
        """The session's state, or (without a session) one replayed from the row and completion."""
        session = member.get("session")
        state = host.sessions.get(str(session)) if session else None
        if session and state is None:
            raise KeyError(str(session))
        return state if state is not None else await host.replay(row, list(member["completion"]))

    async def score(body: Json) -> Json:
        return await host.score(await state_of(body["row"], body), list(body["completion"]))

    async def score_group(body: Json) -> Json:
        members = list(body["members"])
        states = [await state_of(body["row"], m) for m in members]
        results = await host.score_group(states, [list(m["completion"]) for m in members])
        return {"results": results}

    async def close(body: Json) -> Json:
        host.sessions.pop(str(body.get("session")), None)
        return {}

    def route(fn: Any) -> Any:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError("the body is not a JSON object")
            except ValueError as exc:
                return web.json_response({"error": f"bad body: {exc}"}, status=400)
            try:
                return web.json_response(await fn(body))
            except KeyError as exc:
                return web.json_response({"error": f"unknown session or field {exc}"}, status=404)
            except GroupRubric as exc:
                return web.json_response({"error": str(exc)}, status=409)
            except RewardFunctionFailed as exc:
                return web.json_response({"error": str(exc)}, status=422)
            except Exception as exc:
                traceback.print_exc()
                return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)

        return handle

    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/", health)
    app.router.add_get("/rows", rows)
    for name, fn in (
        ("seed", seed),
        ("step", step),
        ("score", score),
        ("score_group", score_group),
        ("close", close),
    ):
        app.router.add_post(f"/{name}", route(fn))
    return app


def load(job: Json) -> Any:
    for path in reversed(job.get("paths") or []):
        sys.path.insert(0, os.path.abspath(path))
    import verifiers as vf  # type: ignore[import-not-found]

    env = vf.load_environment(job["env_id"], **(job.get("args") or {}))
    if job.get("judge"):
        point_judges(env.rubric, job["judge"])
    return env


def point_judges(rubric: Any, at: Json) -> None:
    """Every JudgeRubric in the environment's rubric (RubricGroups walked) asks rollmesh's judge: the
    gateway's OpenAI facade (`at`: base_url, api_key_var, model) instead of its own client."""
    from openai import AsyncOpenAI  # type: ignore[import-not-found]

    for sub in getattr(rubric, "rubrics", None) or []:
        point_judges(sub, at)
    if not hasattr(rubric, "judge_client"):
        return
    rubric.judge_client = AsyncOpenAI(
        base_url=at["base_url"], api_key=os.environ.get(at["api_key_var"]) or "EMPTY"
    )
    rubric.judge_model = at["model"]  # "": the gateway's default model
    objects = getattr(rubric, "class_objects", None)
    if isinstance(objects, dict):
        objects.update(judge_client=rubric.judge_client, judge_model=rubric.judge_model)


def _write_port_file(path: str, port: int) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(f"127.0.0.1:{port}")
    os.replace(path + ".tmp", path)


async def serve_host(make_host: Any) -> None:
    """Bind, serve `make_host()` (this file's Host, or another with its methods), write the port file."""
    host = make_host()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(os.environ.get("ROLLMESH_SIDECAR_PORT", "0"))))
    runner = web.AppRunner(_app(host), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    await asyncio.to_thread(_write_port_file, os.environ["ROLLMESH_PORT_FILE"], sock.getsockname()[1])
    await asyncio.Event().wait()


def serve_or_print_rows(prog: str, name: str, options: str, options_help: str, make_host: Any) -> None:
    """Serve the job in ROLLMESH_VERIFIERS_ENV with `make_host(job)`; or, with `rows`, print its rows
    as rollmesh rows (JSONL on stdout). `name` is the job's key naming what to load (`--env-id`,
    `--taskset`), `options` the key of its JSON options (`--args`, `--config`)."""
    if len(sys.argv) > 1 and sys.argv[1] == "rows":
        parser = argparse.ArgumentParser(prog=f"{prog} rows")
        parser.add_argument(f"--{name.replace('_', '-')}", required=True)
        parser.add_argument("--path", action="append", default=[], help="a folder put on sys.path")
        parser.add_argument(f"--{options}", default="{}", help=options_help)
        parser.add_argument("-n", type=int, default=-1, help="how many rows (-1: all)")
        ns = parser.parse_args(sys.argv[2:])
        job = {name: getattr(ns, name), options: json.loads(getattr(ns, options)), "paths": ns.path}
        for row in make_host(job).rows(ns.n):
            print(json.dumps(row, ensure_ascii=False))
        return
    job = json.loads(os.environ["ROLLMESH_VERIFIERS_ENV"])
    asyncio.run(serve_host(lambda: make_host(job)))


def main() -> None:
    """Serve the environment named in ROLLMESH_VERIFIERS_ENV; or, with `rows`, print its dataset as
    rollmesh rows (JSONL on stdout):

        python _verifiers_server.py rows --env-id vf_calc [--path DIR] [--args '{"k": 1}'] [-n N]
    """
    serve_or_print_rows(
        "_verifiers_server.py",
        "env_id",
        "args",
        "load_environment's keyword arguments (JSON)",
        lambda job: Host(load(job)),
    )


if __name__ == "__main__":
    main()
